//! TEMPORARY: stand-ins for the i15-ds APIs until that branch is merged (removed at the merge).
#![allow(dead_code)]

use weft_client::{Client, ClientError};
use weft_proto::Capability;

pub struct PnfsDevice {
    pub server: u32,
    pub addrs: Vec<std::net::SocketAddr>,
}

#[allow(async_fn_in_trait)]
pub trait PnfsStub {
    async fn pnfs_handle(&self, ino: u64, write: bool) -> Result<Capability, ClientError>;
    async fn pnfs_devices(&self) -> Result<Vec<PnfsDevice>, ClientError>;
}

impl PnfsStub for Client {
    async fn pnfs_handle(&self, ino: u64, _write: bool) -> Result<Capability, ClientError> {
        let _ = ino;
        Ok(Capability::none())
    }
    async fn pnfs_devices(&self) -> Result<Vec<PnfsDevice>, ClientError> {
        Ok(vec![])
    }
}

pub mod ds {
    pub mod fh {
        pub fn encode(_cap: &weft_proto::Capability, unit: u32, count: u32, index: u32, generation: u64) -> Vec<u8> {
            let mut v = vec![1u8];
            v.extend_from_slice(&unit.to_be_bytes());
            v.extend_from_slice(&count.to_be_bytes());
            v.extend_from_slice(&index.to_be_bytes());
            v.extend_from_slice(&generation.to_be_bytes());
            v
        }
    }
}
