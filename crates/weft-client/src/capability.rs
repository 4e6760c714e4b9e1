//! An open file's capability (docs/format.md §10) and its renewal: every data-server request of a [`crate::File`]
//! carries the current one; once less than a third of its lifetime remains (timed by this client's clock from the
//! moment the MDS's answer arrived, so clocks need not agree), the next request renews it first with `RenewOpen`
//! (the owner keeps the open's rights whatever the mode, as with knfsd; others are checked again), and a
//! request refused as expired renews and retries once. Renewal is single-flight: many I/Os in flight renew once.
//! A long-held file (the FUSE mount keeps them for as long as the kernel does) renews lazily on its next I/O.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use weft_proto::msg::OpenResp;
use weft_proto::{Capability, ErrorCode, Rights};
use weft_rpc::RpcError;

use crate::{Client, ClientError};

/// How a file is opened: the rights its capability grants on the data servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Reads only (needs read permission).
    Read,
    /// Writes only (needs write permission), e.g. `O_WRONLY`.
    Write,
    /// Reads and writes (needs both).
    ReadWrite,
}

impl OpenMode {
    pub fn rights(self) -> Rights {
        match self {
            OpenMode::Read => Rights::READ,
            OpenMode::Write => Rights::WRITE,
            OpenMode::ReadWrite => Rights::READ_WRITE,
        }
    }
}

struct CapState {
    cap: Capability,
    rights: Rights,
    /// Renew when a request starts after this.
    renew_at: Instant,
}

pub(crate) struct CapHolder {
    client: Client,
    ino: u64,
    state: Mutex<CapState>,
    /// Held by the one task renewing; the others wait, then take its result.
    renewing: tokio::sync::Mutex<()>,
}

/// Renew once less than this fraction (1/3) of the lifetime remains: two thirds of the lifetime from the answer.
fn renew_at(now: Instant, cap: &Capability, ttl_ms: u64) -> Instant {
    if cap.is_none() {
        // Authentication off: nothing expires, nothing to renew.
        return now + Duration::from_secs(100 * 365 * 24 * 3600);
    }
    now + Duration::from_millis(ttl_ms.saturating_mul(2) / 3)
}

/// A data server's refusal of an expired capability: renew and retry once.
pub(crate) fn is_expired(e: &RpcError) -> bool {
    matches!(e, RpcError::Remote(w) if w.code == ErrorCode::CapabilityExpired)
}

/// One request to data server `server`, made by `make` around this holder's capability, which is renewed once if
/// the server finds it expired: the single calls (`FenceWrites`, `VerifyObject`) that have no transfer unit's retry.
pub(crate) async fn call_with_capability(
    client: &Client,
    server: u32,
    caps: &CapHolder,
    make: impl Fn(Capability) -> weft_proto::Request,
) -> Result<weft_proto::Response, ClientError> {
    let ds = client.data_server(server).await?;
    let mut cap = caps.get().await?;
    let mut renewed = false;
    loop {
        match ds.call_simple(make(cap.clone())).await {
            Ok(r) => return Ok(r),
            Err(source) if !renewed && is_expired(&source) => {
                cap = caps.renew_from(&cap).await?;
                renewed = true;
            }
            Err(source) => return Err(ClientError::Data { server, source }),
        }
    }
}

impl CapHolder {
    pub(crate) fn new(client: Client, ino: u64, rights: Rights, opened: &OpenResp, at: Instant) -> CapHolder {
        CapHolder {
            client,
            ino,
            state: Mutex::new(CapState {
                cap: opened.cap.clone(),
                rights,
                renew_at: renew_at(at, &opened.cap, opened.ttl_ms),
            }),
            renewing: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn rights(&self) -> Rights {
        self.state.lock().expect("capability").rights
    }

    /// The capability to send now, renewed first if it is near its expiry.
    pub(crate) async fn get(&self) -> Result<Capability, ClientError> {
        let cap = {
            let s = self.state.lock().expect("capability");
            if Instant::now() < s.renew_at {
                return Ok(s.cap.clone());
            }
            s.cap.clone()
        };
        self.renew_from(&cap).await
    }

    /// A capability newer than `stale` (which a server refused as expired, or which is near its end): renewed at
    /// the MDS unless another task already did.
    pub(crate) async fn renew_from(&self, stale: &Capability) -> Result<Capability, ClientError> {
        let _one = self.renewing.lock().await;
        let rights = {
            let s = self.state.lock().expect("capability");
            if s.cap.mac != stale.mac || s.cap.expiry_ms != stale.expiry_ms {
                return Ok(s.cap.clone());
            }
            s.rights
        };
        let opened = self.client.renew_capability(self.ino, rights, stale).await?;
        let now = Instant::now();
        let mut s = self.state.lock().expect("capability");
        s.renew_at = renew_at(now, &opened.cap, opened.ttl_ms);
        s.cap = opened.cap;
        tracing::debug!(ino = self.ino, "capability renewed");
        Ok(s.cap.clone())
    }

    /// Widens this capability to cover `other`'s rights too (a second open of the same inode in a mount shares
    /// this file): takes `other`'s capability if it grants at least these rights; if neither covers the other
    /// (read and write-only), asks for both at the next request's renewal.
    pub(crate) fn adopt(&self, other: &CapHolder) {
        let theirs = other.state.lock().expect("capability");
        let mut mine = self.state.lock().expect("capability");
        if theirs.rights.covers(mine.rights) {
            mine.cap = theirs.cap.clone();
            mine.rights = theirs.rights;
            mine.renew_at = theirs.renew_at;
        } else if !mine.rights.covers(theirs.rights) {
            mine.rights = Rights::READ_WRITE;
            mine.renew_at = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_starts_when_a_third_of_the_lifetime_remains() {
        let now = Instant::now();
        let cap = Capability { version: 1, ..Capability::none() };
        assert_eq!(renew_at(now, &cap, 60_000), now + Duration::from_secs(40));
        assert!(renew_at(now, &Capability::none(), 60_000) > now + Duration::from_secs(3600), "auth off: never");
    }

    #[test]
    fn open_modes_map_to_rights() {
        assert_eq!(OpenMode::Read.rights(), Rights::READ);
        assert_eq!(OpenMode::Write.rights(), Rights::WRITE);
        assert_eq!(OpenMode::ReadWrite.rights(), Rights::READ_WRITE);
    }
}
