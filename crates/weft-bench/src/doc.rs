//! The result document every workload writes (the JSON contract of `docs/bench.md`): one builder for the
//! preamble every document shares — `machine` (host facts), `command` and `argv` (the exact command line), `date`,
//! and in `config` the workload's name (`bench`) with the 1-minute/5-minute/15-minute load averages before and
//! after — around the workload's own `config`, `ceilings` and `results`. `weft bench report` and the smoke tests
//! read these fields, so they are written in one place.

use serde_json::{Value, json};

use crate::ceilings;
use crate::common;

/// A document being measured: the machine facts and the load average are read when it starts.
pub struct Document {
    bench: &'static str,
    machine: Value,
    load_average_before: Option<[f64; 3]>,
}

impl Document {
    /// Call before measuring: the load average before is read now.
    pub fn start(bench: &'static str) -> Document {
        Document { bench, load_average_before: ceilings::load_average(), machine: ceilings::machine() }
    }

    /// The load average read by [`Document::start`].
    pub fn load_average_before(&self) -> Option<[f64; 3]> {
        self.load_average_before
    }

    /// The finished document, the load average after read now. `config` is the workload's own (an object; `bench`
    /// and the load averages are added to it), `ceilings` an object (empty where the workload measures none).
    pub fn finish(self, config: Value, ceilings: Value, results: Vec<Value>) -> Value {
        let mut config = match config {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        config.insert("bench".into(), json!(self.bench));
        config.insert("load_average_before".into(), json!(self.load_average_before));
        config.insert("load_average_after".into(), json!(ceilings::load_average()));
        json!({
            "machine": self.machine,
            "command": common::command_line(),
            "argv": common::argv(),
            "date": crate::tables::utc_now(),
            "config": config,
            "ceilings": ceilings,
            "results": results,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preamble_surrounds_the_workloads_fields() {
        let doc = Document::start("latency").finish(json!({"count": 16}), json!({}), vec![json!({"op": "read"})]);
        assert_eq!(doc["config"]["bench"], "latency");
        assert_eq!(doc["config"]["count"], 16);
        assert!(
            doc["config"].get("load_average_before").is_some() && doc["config"].get("load_average_after").is_some()
        );
        assert!(doc["machine"]["cores"].as_u64().unwrap_or(0) >= 1, "{doc}");
        assert!(doc["command"].is_string() && doc["argv"].is_array() && doc["date"].is_string(), "{doc}");
        assert!(doc["ceilings"].is_object());
        assert_eq!(doc["results"][0]["op"], "read");
    }
}
