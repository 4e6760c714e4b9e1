//! Comparing bytes read with a model, for the data-path tests: one failure message that names the first differing
//! byte instead of printing megabytes, and a read of a range through a fresh open.

use bytes::BytesMut;
use weft_client::{Client, ClientError, OpenMode};

/// Asserts `got == want` naming the first differing byte.
#[track_caller]
pub fn same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!("{what}: {} bytes read, {} expected, first difference at {at}", got.len(), want.len());
    }
}

/// Reads `[off, off + len)` of `path` with a fresh open of `c`.
pub async fn read_range(c: &Client, path: &str, off: u64, len: usize) -> Result<Vec<u8>, ClientError> {
    let f = c.open(path, OpenMode::Read).await?;
    let got = f.read_at(off, BytesMut::zeroed(len)).await?;
    Ok(got.to_vec())
}
