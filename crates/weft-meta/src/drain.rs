//! The membership task: every `membership_interval_ms` it advances [`Namespace::membership_tick`] (phases, one
//! batch of the spare scan) and drains one batch of each returned, replaced data server (docs/format.md §19).
//!
//! A drain lists the server's objects (`ListObjects`, op 224, in pages of [`DRAIN_BATCH`]) and deletes
//! (`RemoveObject`, op 203) each one whose inode's current layout does not name the server; when a whole listing
//! went through without an error the server becomes a spare ([`Namespace::drained`]).
//!
//! Invariant: a drain never deletes an object a current layout names: the layout is read after the listing and
//! before the removal, and no layout can come to name a draining server meanwhile (no spare and no new file is
//! ever placed on one, see `membership.rs`).
//!
//! [`Namespace::membership_tick`]: crate::Namespace::membership_tick
//! [`Namespace::drained`]: crate::Namespace::drained

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};
use weft_fabric::TcpFabric;
use weft_proto::msg::{InoReq, ListObjectsReq};
use weft_proto::{Request, Response};
use weft_rpc::{ClientConfig, Credential, RpcClient};

use crate::MdsNamespace;
use crate::membership::MEMBERSHIP_SCAN_BATCH;

/// Objects examined per draining server per tick.
pub const DRAIN_BATCH: u32 = 256;

/// Runs membership and drains until the process ends. `credential`: the cluster key the MDS proves to the data
/// servers (none with authentication off).
pub(crate) async fn run_membership(
    ns: Arc<MdsNamespace>,
    tcp: TcpFabric,
    interval_ms: u64,
    credential: Option<Credential>,
) {
    let rpc_cfg = ClientConfig {
        client_name: "mds-drain".into(),
        slots: 8,
        attempts_max: 1,
        credential,
        ..ClientConfig::default()
    };
    let mut clients: HashMap<u32, RpcClient<TcpFabric>> = HashMap::new();
    // Per draining server: the last inode listed whose page went through.
    let mut cursors: HashMap<u32, u64> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(interval_ms.max(10)));
    loop {
        tick.tick().await;
        let n = ns.clone();
        // Every service refreshes its view of the servers; only the duty holder decides (format §28).
        let step = move || {
            if n.duty_held() {
                n.membership_tick(MEMBERSHIP_SCAN_BATCH).map(|()| true)
            } else {
                n.refresh_servers().map(|()| false)
            }
        };
        match tokio::task::spawn_blocking(step).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => continue,
            Ok(Err(e)) => warn!("membership: step failed, retrying next tick: {e}"),
            Err(e) => warn!("membership: step panicked: {e}"),
        }
        let draining = ns.draining_servers();
        cursors.retain(|id, _| draining.iter().any(|(d, _)| d == id));
        for (id, addr) in draining {
            let client = match clients.get(&id) {
                Some(c) => c.clone(),
                None => match RpcClient::connect(tcp.clone(), &addr, rpc_cfg.clone()).await {
                    Ok(c) => {
                        clients.insert(id, c.clone());
                        c
                    }
                    Err(e) => {
                        debug!(server = id, addr = %addr, "drain: cannot reach data server: {e}");
                        continue;
                    }
                },
            };
            let after = cursors.get(&id).copied().unwrap_or(0);
            match drain_page(&ns, &client, id, after).await {
                Ok(Some(next)) => {
                    cursors.insert(id, next);
                }
                Ok(None) => {
                    cursors.remove(&id);
                    ns.drained(id);
                }
                Err(e) => {
                    debug!(server = id, addr = %addr, after, "drain: page failed, retrying next tick: {e}");
                    clients.remove(&id);
                }
            }
        }
    }
}

/// Drains one page of server `id`'s objects above `after`: `Some(last)` to go on after `last`, `None` when the
/// listing ended.
async fn drain_page(
    ns: &Arc<MdsNamespace>,
    client: &RpcClient<TcpFabric>,
    id: u32,
    after: u64,
) -> Result<Option<u64>, String> {
    let resp = client
        .call_simple(Request::ListObjects(ListObjectsReq { after, limit: DRAIN_BATCH }))
        .await
        .map_err(|e| e.to_string())?;
    let Response::ListObjects(page) = resp else { return Err(format!("unexpected reply {:?}", resp.op())) };
    // Checked before use: ascending and above the cursor, at most what was asked for.
    if page.inos.len() > DRAIN_BATCH as usize
        || page.inos.windows(2).any(|w| w[0] >= w[1])
        || page.inos.first().is_some_and(|f| *f <= after)
    {
        return Err(format!("malformed ListObjects reply ({} inodes)", page.inos.len()));
    }
    let inos = page.inos.clone();
    let n = ns.clone();
    let unowned = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        for ino in inos {
            if !n.object_owned(ino, id)? {
                out.push(ino);
            }
        }
        Ok::<_, crate::MetaError>(out)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    for ino in &unowned {
        client.call_simple(Request::RemoveObject(InoReq { ino: *ino })).await.map_err(|e| e.to_string())?;
    }
    if !unowned.is_empty() {
        info!(server = id, removed = unowned.len(), "drain: deleted objects no current layout names");
    }
    match page.inos.last() {
        Some(last) if !page.eof => Ok(Some(*last)),
        _ => Ok(None),
    }
}
