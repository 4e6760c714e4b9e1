//! A small SVG bar chart of a throughput result: MiB/s per point and op, with the iperf3 ceiling as a line.
//! Hand-written SVG keeps the build free of a plotting stack for one kind of chart.

use serde_json::Value;

pub fn throughput_svg(doc: &Value) -> String {
    let results: Vec<&Value> = doc["results"].as_array().map(|v| v.iter().collect()).unwrap_or_default();
    let iperf = doc.pointer("/ceilings/iperf3_mib_per_s").and_then(Value::as_f64);
    let top = results.iter().filter_map(|r| r["max"].as_f64()).chain(iperf).fold(1.0f64, f64::max) * 1.1;
    let (w, h, left, bottom, top_pad) = (120 + 70 * results.len().max(1), 360.0, 60.0, 60.0, 30.0);
    let plot_h = h - bottom - top_pad;
    let y = |v: f64| top_pad + plot_h * (1.0 - v / top);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"DejaVu Sans, sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"18\" font-size=\"13\">weft bench throughput: MiB/s (median, bars show min–max)</text>\n"
    );
    for i in 0..=4 {
        let v = top * f64::from(i) / 4.0;
        let (right, yv, yt) = (w as f64 - 10.0, y(v), y(v) + 4.0);
        s += &format!(
            "<line x1=\"{left}\" x2=\"{right}\" y1=\"{yv:.1}\" y2=\"{yv:.1}\" stroke=\"#ddd\"/><text x=\"5\" y=\"{yt:.1}\">{v:.0}</text>\n"
        );
    }
    for (i, r) in results.iter().enumerate() {
        let x = left + 10.0 + 70.0 * i as f64;
        let m = r["mib_per_s"].as_f64().unwrap_or(0.0);
        let color = if r["op"] == "read" { "#3b7dd8" } else { "#e08a2c" };
        s += &format!(
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"40\" height=\"{:.1}\" fill=\"{color}\"/>\n",
            y(m),
            (plot_h + top_pad - y(m)).max(0.0)
        );
        if let (Some(lo), Some(hi)) = (r["min"].as_f64(), r["max"].as_f64()) {
            s += &format!(
                "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{1:.1}\" y2=\"{2:.1}\" stroke=\"black\"/>\n",
                x + 20.0,
                y(lo),
                y(hi)
            );
        }
        s += &format!(
            "<text x=\"{x:.1}\" y=\"{:.1}\">{} s={}</text><text x=\"{x:.1}\" y=\"{:.1}\">{}</text>\n",
            h - bottom + 15.0,
            r["op"].as_str().unwrap_or(""),
            r["servers"],
            h - bottom + 30.0,
            crate::report::human_bytes(r["record_bytes"].as_u64().unwrap_or(0))
        );
    }
    if let Some(i) = iperf {
        let (right, yi, xt, yt) = (w as f64 - 10.0, y(i), left + 5.0, y(i) - 4.0);
        s += &format!(
            "<line x1=\"{left}\" x2=\"{right}\" y1=\"{yi:.1}\" y2=\"{yi:.1}\" stroke=\"red\" stroke-dasharray=\"4 3\"/>\
             <text x=\"{xt}\" y=\"{yt:.1}\" fill=\"red\">iperf3 loopback {i:.0}</text>\n"
        );
    }
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_has_a_bar_per_result() {
        let doc = serde_json::json!({
            "ceilings": {"iperf3_mib_per_s": 1000.0},
            "results": [
                {"op": "write", "servers": 1, "record_bytes": 1048576, "mib_per_s": 500.0, "min": 450.0, "max": 550.0},
                {"op": "read", "servers": 1, "record_bytes": 1048576, "mib_per_s": 800.0, "min": 700.0, "max": 900.0}
            ]
        });
        let svg = throughput_svg(&doc);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<rect x=").count(), 2);
        assert!(svg.contains("iperf3 loopback 1000"));
    }
}
