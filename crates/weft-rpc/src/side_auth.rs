//! The key proof a fabric's side channel runs before anything else (the `rdma` TCP side channel, before any queue
//! pair or memory registration exists for the peer): the same HMAC-SHA256 challenge–response as the RPC handshake
//! (auth.rs) under its own label, fresh nonces both ways, the key never on the wire. Byte layout in
//! docs/format.md §4 ("Side-channel authentication").

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weft_fabric::side_auth::{SideAuthFuture, SideChannelAuth, SideStream};
use weft_proto::msg::KEY_ID_BYTES_MAX;

use crate::auth::{Credential, KeyRing, Secret, random_bytes, side_proof, side_proof_matches};

const MAGIC: &[u8; 4] = b"WFSA";
const VERSION: u8 = 1;
/// Status bytes the server sends.
const ACCEPTED: u8 = 0;
const REFUSED: u8 = 1;

fn refused(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, msg.into())
}

/// The client's half: proves `credential`, and checks the server proves the same key.
pub struct SideClient(pub Credential);

/// The server's half: accepts any key of the ring.
pub struct SideServer(pub Arc<KeyRing>);

impl SideClient {
    pub fn boxed(c: Credential) -> Arc<dyn SideChannelAuth> {
        Arc::new(SideClient(c))
    }
}

impl SideServer {
    pub fn boxed(ring: Arc<KeyRing>) -> Arc<dyn SideChannelAuth> {
        Arc::new(SideServer(ring))
    }
}

async fn client(cred: &Credential, s: &mut dyn SideStream) -> std::io::Result<()> {
    let key_id = cred.key_id.as_bytes();
    if key_id.is_empty() || key_id.len() > KEY_ID_BYTES_MAX {
        return Err(refused("key id length out of range"));
    }
    let client_nonce = random_bytes().map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut hello = Vec::with_capacity(6 + key_id.len() + 32);
    hello.extend_from_slice(MAGIC);
    hello.push(VERSION);
    hello.push(key_id.len() as u8);
    hello.extend_from_slice(key_id);
    hello.extend_from_slice(&client_nonce);
    s.write_all(&hello).await?;
    let mut status = [0u8; 1];
    s.read_exact(&mut status).await?;
    if status[0] != ACCEPTED {
        return Err(refused(format!(
            "the server does not accept key {:?} on its side channel (status {}): does it hold our key, and does it \
             authenticate at all?",
            cred.key_id, status[0]
        )));
    }
    let mut reply = [0u8; 64];
    s.read_exact(&mut reply).await?;
    let server_nonce: Secret = reply[..32].try_into().expect("32 bytes");
    let server_proof: Secret = reply[32..].try_into().expect("32 bytes");
    if !side_proof_matches(&cred.key, true, &cred.key_id, &client_nonce, &server_nonce, &server_proof) {
        return Err(refused("the server could not prove our key on the side channel (it holds another key)"));
    }
    s.write_all(&side_proof(&cred.key, false, &cred.key_id, &client_nonce, &server_nonce)).await?;
    s.read_exact(&mut status).await?;
    if status[0] != ACCEPTED {
        return Err(refused("the server refused our proof on the side channel"));
    }
    Ok(())
}

async fn server(ring: &KeyRing, s: &mut dyn SideStream, peer: &str) -> std::io::Result<()> {
    let mut head = [0u8; 6];
    s.read_exact(&mut head).await?;
    if &head[..4] != MAGIC || head[4] != VERSION {
        let _ = s.write_all(&[REFUSED]).await;
        return Err(refused(format!("{peer}: no side-channel authentication from the peer (does it hold our key?)")));
    }
    let len = head[5] as usize;
    if len == 0 || len > KEY_ID_BYTES_MAX {
        let _ = s.write_all(&[REFUSED]).await;
        return Err(refused(format!("{peer}: key id of {len} bytes")));
    }
    let mut rest = vec![0u8; len + 32];
    s.read_exact(&mut rest).await?;
    let key_id = String::from_utf8_lossy(&rest[..len]).into_owned();
    let client_nonce: Secret = rest[len..].try_into().expect("32 bytes");
    let Some((key, _policy)) = std::str::from_utf8(&rest[..len]).ok().and_then(|k| ring.get(k)) else {
        let _ = s.write_all(&[REFUSED]).await;
        return Err(refused(format!("{peer}: unknown key id {key_id:?}")));
    };
    let server_nonce = random_bytes().map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut reply = Vec::with_capacity(65);
    reply.push(ACCEPTED);
    reply.extend_from_slice(&server_nonce);
    reply.extend_from_slice(&side_proof(&key, true, &key_id, &client_nonce, &server_nonce));
    s.write_all(&reply).await?;
    let mut proof = [0u8; 32];
    s.read_exact(&mut proof).await.map_err(|e| {
        refused(format!("{peer}: left without proving key {key_id:?} (it holds another key; see its log): {e}"))
    })?;
    if !side_proof_matches(&key, false, &key_id, &client_nonce, &server_nonce, &proof) {
        let _ = s.write_all(&[REFUSED]).await;
        return Err(refused(format!("{peer}: wrong proof of key {key_id:?}")));
    }
    s.write_all(&[ACCEPTED]).await?;
    Ok(())
}

impl SideChannelAuth for SideClient {
    fn client<'a>(&'a self, stream: &'a mut dyn SideStream) -> SideAuthFuture<'a> {
        Box::pin(client(&self.0, stream))
    }
    fn server<'a>(&'a self, _stream: &'a mut dyn SideStream, _peer: &'a str) -> SideAuthFuture<'a> {
        Box::pin(async { Err(refused("a client credential does not accept side channels")) })
    }
}

impl SideChannelAuth for SideServer {
    fn client<'a>(&'a self, _stream: &'a mut dyn SideStream) -> SideAuthFuture<'a> {
        Box::pin(async { Err(refused("a server key ring does not open side channels")) })
    }
    fn server<'a>(&'a self, stream: &'a mut dyn SideStream, peer: &'a str) -> SideAuthFuture<'a> {
        Box::pin(server(&self.0, stream, peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Key;

    async fn exchange(client_key: Key, server_key: Key) -> (std::io::Result<()>, std::io::Result<()>) {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let c = SideClient(Credential::cluster(client_key));
        let s = SideServer(Arc::new(KeyRing::cluster(server_key)));
        // A client that gives up closes its side channel (the fabric drops the stream), as here.
        let client = async move {
            let r = c.client(&mut a).await;
            drop(a);
            r
        };
        tokio::join!(client, s.server(&mut b, "test"))
    }

    #[tokio::test]
    async fn the_same_key_passes_and_another_is_refused_on_both_sides() {
        let (c, s) = exchange(Key::from_bytes([7; 32]), Key::from_bytes([7; 32])).await;
        c.unwrap();
        s.unwrap();
        let (c, s) = exchange(Key::from_bytes([7; 32]), Key::from_bytes([8; 32])).await;
        assert_eq!(c.unwrap_err().kind(), std::io::ErrorKind::PermissionDenied);
        assert!(s.is_err(), "the server refuses a client that stopped proving");
    }

    #[tokio::test]
    async fn a_peer_that_does_not_authenticate_is_refused() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let s = SideServer(Arc::new(KeyRing::cluster(Key::from_bytes([7; 32]))));
        // A client without a key starts with its queue pair's connection info ("WFRC...").
        a.write_all(b"WFRC\\x01\\x00").await.unwrap();
        let e = s.server(&mut b, "test").await.unwrap_err();
        assert!(e.to_string().contains("no side-channel authentication"), "{e}");
        let mut status = [0u8; 1];
        a.read_exact(&mut status).await.unwrap();
        assert_eq!(status[0], REFUSED);
    }

    #[test]
    fn proofs_differ_by_direction_and_label() {
        let k = Key::from_bytes([1; 32]);
        let (cn, sn) = ([2; 32], [3; 32]);
        let server = side_proof(&k, true, "cluster", &cn, &sn);
        assert_ne!(server, side_proof(&k, false, "cluster", &cn, &sn));
        assert_ne!(server, crate::auth::server_proof(&k, "cluster", &cn, &sn), "not the RPC handshake's proof");
        assert!(side_proof_matches(&k, true, "cluster", &cn, &sn, &server));
    }
}
