//! The lease channel (docs/format.md §31), shared by every holder of metadata leases (the FUSE mount, which applies
//! recalls to its kernel; [`crate::meta_cache`], which applies them to its own memory): one `LeaseWait` call after
//! another on the client's MDS session, each acknowledging the recalls the holder applied from the reply before.
//! A reply not received within the holder's trust horizon, or a failed call, drops every lease.

use std::future::Future;
use std::time::{Duration, Instant};

use weft_proto::msg::LeaseWaitResp;

use crate::Client;

/// How long the MDS may hold one `LeaseWait` (it caps this at a third of the lease).
const HOLD_MS: u32 = 1_000;
/// Wait before asking again after a failed call, or at a service that grants no leases.
const RETRY_MS: u64 = 500;
const NO_LEASES_RETRY_MS: u64 = 30_000;

/// What a lease channel keeps up to date.
pub trait LeaseHolder {
    /// The epoch its leases are held under (0: none) and the instant it stops trusting them.
    fn held(&self) -> (u64, Option<Instant>);
    /// Applies a reply to a call sent at `sent` on MDS session `session`; the next call acknowledges its recalls.
    fn received(&self, resp: &LeaseWaitResp, sent: Instant, session: u64) -> impl Future<Output = ()> + Send;
    /// Drops every lease (the channel failed, or the trust ran out).
    fn lose(&self) -> impl Future<Output = ()> + Send;
}

/// Runs the channel of `holder` over the client `client` returns, until it returns `None` (the client is gone) or
/// the task is aborted. `no_leases` says, in the debug log, what the holder does at a service that grants none.
pub async fn run(mut client: impl FnMut() -> Option<Client>, holder: impl LeaseHolder, no_leases: &str) {
    let mut acked = 0;
    loop {
        let Some(c) = client() else { return };
        let (epoch, until) = holder.held();
        let sent = Instant::now();
        let call = c.lease_wait(epoch, acked, HOLD_MS);
        let answered = match until {
            Some(u) => tokio::time::timeout_at(u.into(), call).await.ok(),
            None => Some(call.await),
        };
        let pause_ms = match answered {
            Some(Ok(resp)) => {
                holder.received(&resp, sent, c.mds_session()).await;
                acked = resp.upto;
                if resp.epoch != 0 {
                    continue;
                }
                tracing::debug!("the metadata service grants no leases: {no_leases}");
                NO_LEASES_RETRY_MS
            }
            Some(Err(e)) => {
                tracing::debug!("lease channel: {e}; cached metadata is dropped");
                RETRY_MS
            }
            None => {
                tracing::debug!("lease channel: no answer within the lease; cached metadata is dropped");
                RETRY_MS
            }
        };
        holder.lose().await;
        acked = 0;
        drop(c);
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
    }
}
