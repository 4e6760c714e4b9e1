//! The metadata service's garbage collector: deletes the objects of removed files from the data servers.
//!
//! Invariant: a file's objects are deleted only after the transaction that removed its last name committed (it
//! records the file in the orphan table in that same transaction), so a crash never loses track of them; the
//! orphan record is cleared only once every server of the layout has removed its object.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};
use weft_fabric::TcpFabric;
use weft_proto::Request;
use weft_proto::msg::InoReq;
use weft_rpc::{ClientConfig, Credential, RpcClient};

use crate::MdsNamespace;

/// Most orphans handled per round; the rest wait for the next one.
const GC_BATCH: usize = 256;

/// `tcp`: the fabric to reach the data servers with (under TLS when the MDS has it). `credential`: the cluster key the MDS proves to the data servers (none with authentication off).
pub(crate) async fn collect_orphans(
    ns: Arc<MdsNamespace>,
    tcp: TcpFabric,
    interval_ms: u64,
    credential: Option<Credential>,
) {
    let mut clients: HashMap<u32, RpcClient<TcpFabric>> = HashMap::new();
    let rpc_cfg =
        ClientConfig { client_name: "mds-gc".into(), slots: 8, attempts_max: 1, credential, ..ClientConfig::default() };
    let mut tick = tokio::time::interval(Duration::from_millis(interval_ms.max(10)));
    loop {
        tick.tick().await;
        // One collector per database: the duty holder's (format §28).
        if !ns.duty_held() {
            continue;
        }
        let orphans = {
            let ns = ns.clone();
            match tokio::task::spawn_blocking(move || ns.orphans(GC_BATCH)).await {
                Ok(o) => o,
                Err(_) => continue,
            }
        };
        if orphans.is_empty() {
            continue;
        }
        let addrs: HashMap<u32, String> = ns.servers().into_iter().map(|s| (s.id, s.addr)).collect();
        let (found, mut collected) = (orphans.len(), 0usize);
        for (ino, layout) in orphans {
            let mut all_removed = true;
            for server in &layout.servers {
                let client = match clients.get(server) {
                    Some(c) => c.clone(),
                    None => {
                        let Some(addr) = addrs.get(server) else {
                            all_removed = false;
                            continue;
                        };
                        match RpcClient::connect(tcp.clone(), addr, rpc_cfg.clone()).await {
                            Ok(c) => {
                                clients.insert(*server, c.clone());
                                c
                            }
                            Err(e) => {
                                debug!(server, addr = %addr, ino, "orphan collection: cannot reach data server: {e}");
                                all_removed = false;
                                continue;
                            }
                        }
                    }
                };
                if let Err(e) = client.call_simple(Request::RemoveObject(InoReq { ino })).await {
                    debug!(
                        server,
                        addr = addrs.get(server).map_or("?", |a| a.as_str()),
                        ino,
                        "orphan collection: remove failed, will retry: {e}"
                    );
                    clients.remove(server);
                    all_removed = false;
                }
            }
            if all_removed {
                let ns = ns.clone();
                match tokio::task::spawn_blocking(move || ns.orphan_done(ino)).await {
                    Ok(Ok(())) => {
                        collected += 1;
                        debug!(ino, servers = ?layout.servers, "orphan collection: objects of a removed file deleted");
                    }
                    other => warn!(ino, "orphan collection: cannot clear the orphan record: {other:?}"),
                }
            }
        }
        // One line per round that deleted something; a round that could not (a server down) retries every
        // interval, so it says so at debug only.
        if collected > 0 {
            info!(found, collected, left = found - collected, "orphan collection: removed files' objects deleted");
        } else {
            debug!(found, "orphan collection: nothing could be deleted this round");
        }
    }
}
