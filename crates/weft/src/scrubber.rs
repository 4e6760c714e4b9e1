//! The background scrubber `weft meta` runs beside the metadata service (docs/format.md §20): the scrub of `weft
//! scrub` (`weft_client::scrub`) over the whole namespace, one pass every `scrub_interval_ms`, paced to
//! `scrub_mib_per_s` (0: off). It connects to its own MDS as a client proving the cluster key, acting as root
//! (the cluster key is trusted to assert users, docs/format.md §9), logs every repair and every unrepairable
//! finding, and counts them in the MDS's metrics. Memory is the scrub's: bounded (`weft_client::scrub`).

use std::sync::Arc;
use std::time::Duration;

use weft_client::scrub::{ScrubOptions, scrub_path};
use weft_client::{Client, ClusterConfig};
use weft_rpc::metrics::prometheus_client::metrics::counter::Counter;

/// What the scrubber needs from the MDS's config.
pub struct Scrubber {
    rate_mib_per_s: u64,
    interval_ms: u64,
    cluster: ClusterConfig,
}

/// The scrubber's metrics (`weft_mds_scrub_*`).
#[derive(Clone, Default)]
struct Counters {
    passes: Counter,
    files: Counter,
    bytes: Counter,
    chunks: Counter,
    inconsistencies: Counter,
    repaired: Counter,
    unrepairable: Counter,
}

impl Scrubber {
    pub fn from_meta(cfg: &weft_meta::MetaConfig) -> Scrubber {
        let cluster = crate::commands::beside_mds_cluster(cfg);
        Scrubber { rate_mib_per_s: cfg.scrub_mib_per_s, interval_ms: cfg.scrub_interval_ms, cluster }
    }

    /// Starts the scrubber's loop (unless it is off) against the MDS listening at `addr`.
    /// It runs a pass only while `duty.held()` (this service holds the duty lease, docs/format.md §28).
    pub fn spawn(self, metrics: Option<&Arc<weft_rpc::Metrics>>, addr: &str, duty: weft_meta::DutyFlag) {
        if self.rate_mib_per_s == 0 {
            return;
        }
        let counters = Counters::default();
        if let Some(m) = metrics {
            let c = counters.clone();
            m.register("weft_mds_scrub_passes", "Background scrub passes finished", c.passes);
            m.register("weft_mds_scrub_files", "Files the background scrubber checked", c.files);
            m.register("weft_mds_scrub_bytes", "File bytes the background scrubber checked", c.bytes);
            m.register("weft_mds_scrub_chunks", "Chunks the background scrubber checked", c.chunks);
            m.register(
                "weft_mds_scrub_inconsistencies",
                "Inconsistencies the background scrubber found",
                c.inconsistencies,
            );
            m.register("weft_mds_scrub_repaired", "Inconsistencies the background scrubber repaired", c.repaired);
            m.register(
                "weft_mds_scrub_unrepairable",
                "Inconsistencies the background scrubber could not repair",
                c.unrepairable,
            );
        }
        let mut cluster = self.cluster;
        cluster.mds = addr.to_string();
        let opts = ScrubOptions { repair: true, rate_mib_per_s: self.rate_mib_per_s };
        let interval = Duration::from_millis(self.interval_ms.max(1));
        tokio::spawn(async move {
            let mut next = tokio::time::Instant::now();
            loop {
                tokio::time::sleep_until(next).await;
                next += interval;
                if !duty.held() {
                    continue;
                }
                match pass(&cluster, opts).await {
                    Ok(r) => {
                        for (c, v) in [
                            (&counters.files, r.files),
                            (&counters.bytes, r.bytes),
                            (&counters.chunks, r.chunks),
                            (&counters.inconsistencies, r.inconsistencies),
                            (&counters.repaired, r.repaired),
                            (&counters.unrepairable, r.unrepairable),
                        ] {
                            c.inc_by(v);
                        }
                        counters.passes.inc();
                        tracing::info!(
                            files = r.files,
                            bytes = r.bytes,
                            chunks = r.chunks,
                            inconsistencies = r.inconsistencies,
                            repaired = r.repaired,
                            unrepairable = r.unrepairable,
                            "background scrub pass done"
                        );
                    }
                    Err(e) => tracing::warn!("background scrub pass failed: {e}"),
                }
                // Never run passes back to back when one took longer than the interval.
                next = next.max(tokio::time::Instant::now());
            }
        });
    }
}

/// One pass over the whole namespace with a fresh client (so a restarted data server is reached anew).
async fn pass(cluster: &ClusterConfig, opts: ScrubOptions) -> Result<weft_client::scrub::ScrubReport, String> {
    let root = weft_client::user_cred(0, 0, Vec::new()).map_err(|e| e.to_string())?;
    let client = Client::connect(cluster).await.map_err(|e| e.to_string())?.with_user(root);
    let r = scrub_path(&client, "/", opts).await.map_err(|e| e.to_string());
    client.close().await;
    r
}
