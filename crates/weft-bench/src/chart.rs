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
        let color = match r["op"].as_str() {
            Some("read") => "#3b7dd8",
            Some("degraded-read") => "#9c27b0",
            _ => "#e08a2c",
        };
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
        // Redundant layouts name themselves under the bar; plain (and results from before `--layout`) do not.
        let layout = r["layout"].as_str().filter(|l| *l != "plain").map_or(String::new(), |l| format!(" {l}"));
        let op = match r["op"].as_str().unwrap_or("") {
            "degraded-read" => "degr.",
            op => op,
        };
        s += &format!(
            "<text x=\"{x:.1}\" y=\"{:.1}\">{op} s={}</text><text x=\"{x:.1}\" y=\"{:.1}\">{}{layout}</text>\n",
            h - bottom + 15.0,
            r["servers"],
            h - bottom + 30.0,
            crate::tables::human_bytes(r["record_bytes"].as_u64().unwrap_or(0))
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

/// One bar of a [`bars_svg`] chart: the median, its min–max whisker, two label lines, and a colour.
pub struct Bar {
    pub value: f64,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub label: String,
    pub sublabel: String,
    pub color: &'static str,
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A bar chart of one figure per result, with a min–max whisker per bar and a linear axis from 0.
pub fn bars_svg(title: &str, bars: &[Bar]) -> String {
    let top =
        bars.iter().map(|b| b.max.unwrap_or(b.value).max(b.value)).filter(|v| v.is_finite()).fold(1e-9, f64::max) * 1.1;
    // Wide enough for every bar and for the title (about 7 px per character at 13 px).
    let w = (120 + 70 * bars.len().max(1)).max(70 + 7 * title.chars().count());
    let (h, left, bottom, top_pad) = (360.0, 60.0, 60.0, 30.0);
    let plot_h = h - bottom - top_pad;
    let y = |v: f64| top_pad + plot_h * (1.0 - (v / top).clamp(0.0, 1.0));
    let title = xml_escape(title);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"DejaVu Sans, sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"18\" font-size=\"13\">{title}</text>\n"
    );
    for i in 0..=4 {
        let v = top * f64::from(i) / 4.0;
        let (right, yv, yt) = (w as f64 - 10.0, y(v), y(v) + 4.0);
        let digits = if top < 10.0 { 1 } else { 0 };
        s += &format!(
            "<line x1=\"{left}\" x2=\"{right}\" y1=\"{yv:.1}\" y2=\"{yv:.1}\" stroke=\"#ddd\"/><text x=\"5\" y=\"{yt:.1}\">{v:.digits$}</text>\n"
        );
    }
    for (i, b) in bars.iter().enumerate() {
        let x = left + 10.0 + 70.0 * i as f64;
        let v = if b.value.is_finite() { b.value } else { 0.0 };
        s += &format!(
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"40\" height=\"{:.1}\" fill=\"{}\"/>\n",
            y(v),
            (plot_h + top_pad - y(v)).max(0.0),
            b.color
        );
        if let (Some(lo), Some(hi)) = (b.min, b.max) {
            s += &format!(
                "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{1:.1}\" y2=\"{2:.1}\" stroke=\"black\"/>\n",
                x + 20.0,
                y(lo),
                y(hi)
            );
        }
        s += &format!(
            "<text x=\"{x:.1}\" y=\"{:.1}\">{}</text><text x=\"{x:.1}\" y=\"{:.1}\">{}</text>\n",
            h - bottom + 15.0,
            xml_escape(&b.label),
            h - bottom + 30.0,
            xml_escape(&b.sublabel)
        );
    }
    s += "</svg>\n";
    s
}

const COLORS: [&str; 5] = ["#e08a2c", "#3b7dd8", "#4caf50", "#9c27b0", "#795548"];

fn op_color(op: &str) -> &'static str {
    match op {
        "write" | "rewrite" | "create" => COLORS[0],
        "read" | "reread" | "stat" => COLORS[1],
        "readdir" => COLORS[2],
        "remove" => COLORS[3],
        _ => COLORS[4],
    }
}

fn bars_of(doc: &Value, key: &str, sublabel: impl Fn(&Value) -> String) -> Vec<Bar> {
    doc["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let op = r["op"].as_str().unwrap_or("");
            Bar {
                value: r[key].as_f64().unwrap_or(0.0),
                min: r["min"].as_f64(),
                max: r["max"].as_f64(),
                label: op.to_string(),
                sublabel: sublabel(r),
                color: op_color(op),
            }
        })
        .collect()
}

/// `weft bench meta`: ops/s per op, servers and clients.
pub fn meta_svg(doc: &Value) -> String {
    let mode = doc.pointer("/config/mode").and_then(Value::as_str).unwrap_or("");
    if mode == "failover" {
        let bars = bars_of(doc, "median", |r| format!("{} c={}", r["meta"].as_str().unwrap_or("?"), r["clients"]));
        return bars_svg("weft bench meta --failover: p99 ms from the kill (median of runs, bars show min–max)", &bars);
    }
    let bars = bars_of(doc, "ops_per_s", |r| {
        format!("{} s={} c={}", r["meta"].as_str().unwrap_or("redb"), r["servers"], r["clients"])
    });
    bars_svg(&format!("weft bench meta ({mode}): ops/s (median, bars show min–max)"), &bars)
}

/// `weft bench latency`: p50 µs per op, record size and servers.
pub fn latency_svg(doc: &Value) -> String {
    let bars = bars_of(doc, "p50_us", |r| {
        format!("{} s={}", crate::tables::human_bytes(r["record_bytes"].as_u64().unwrap_or(0)), r["servers"])
    });
    bars_svg("weft bench latency: p50 µs per call (median of runs, bars show min–max)", &bars)
}

/// `weft bench zipf`: ops/s per op, record size and servers.
pub fn zipf_svg(doc: &Value) -> String {
    let bars = bars_of(doc, "ops_per_s", |r| {
        format!("{} s={}", crate::tables::human_bytes(r["record_bytes"].as_u64().unwrap_or(0)), r["servers"])
    });
    bars_svg("weft bench zipf: ops/s (median, bars show min–max)", &bars)
}

/// `weft bench checkpoint`: aggregate MiB/s per stripe count, mode and process count.
pub fn checkpoint_svg(doc: &Value) -> String {
    let bars = bars_of(doc, "mib_per_s", |r| {
        format!("k={} {} p={}", r["stripes"], r["mode"].as_str().unwrap_or(""), r["procs"])
    });
    bars_svg("weft bench checkpoint: aggregate MiB/s (median, bars show min–max)", &bars)
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

    #[test]
    fn bar_charts_have_a_bar_per_result() {
        let doc = serde_json::json!({
            "config": {"mode": "private"},
            "results": [
                {"op": "create", "servers": 4, "clients": 8, "ops_per_s": 5000.0, "min": 4000.0, "max": 6000.0,
                 "p50_us": 10.0, "record_bytes": 4096},
                {"op": "stat", "servers": 4, "clients": 8, "ops_per_s": 9000.0, "min": 8000.0, "max": 9500.0,
                 "p50_us": 0.5, "record_bytes": 1}
            ]
        });
        for svg in [meta_svg(&doc), latency_svg(&doc), zipf_svg(&doc)] {
            assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
            // The background plus one bar per result.
            assert_eq!(svg.matches("<rect x=").count(), 2, "{svg}");
            assert!(!svg.contains("NaN"));
        }
        assert!(meta_svg(&doc).contains("s=4 c=8"));
        assert!(latency_svg(&doc).contains("4K s=4"));
        assert_eq!(bars_svg("empty & <odd>", &[]).matches("&amp;").count(), 1);
    }
}
