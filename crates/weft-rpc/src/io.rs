//! Frame I/O shared by client and server: read a header and body with limits checked first, write a frame from
//! header, body and payload segments with one vectored write (payload bytes are never copied into a frame buffer).

use std::io::IoSlice;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use weft_proto::{FrameError, FrameLimits, HEADER_LEN, Header};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Frame(#[from] FrameError),
    /// A TLS record came where a frame header was due: the peer runs `tcp` under TLS and this end does not.
    #[error("the peer speaks TLS (tls = true on its side) but tls is off here: set tls = true and tls_ca_file")]
    PeerSpeaksTls,
}

/// Whether `head` starts like a TLS record (handshake or alert, TLS 1.x), as a TLS peer's first bytes do.
fn looks_like_tls(head: &[u8]) -> bool {
    matches!(head, [0x15 | 0x16, 0x03, 0x01..=0x04, ..])
}

/// Reads one header and its body. The body checksum is verified by the caller (so it can still answer the
/// frame with an error while keeping the stream in step).
pub async fn read_head<R: AsyncRead + Unpin>(r: &mut R, limits: &FrameLimits) -> Result<(Header, Vec<u8>), ReadError> {
    let mut hb = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r.read(&mut hb[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Err(ReadError::Closed);
            }
            if looks_like_tls(&hb[..got]) {
                return Err(ReadError::PeerSpeaksTls);
            }
            return Err(FrameError::Truncated { need: HEADER_LEN, have: got }.into());
        }
        got += n;
    }
    let h = match Header::decode(&hb, limits) {
        Ok(h) => h,
        Err(_) if looks_like_tls(&hb) => return Err(ReadError::PeerSpeaksTls),
        Err(e) => return Err(e.into()),
    };
    let mut body = vec![0u8; h.body_len as usize];
    r.read_exact(&mut body).await?;
    Ok((h, body))
}

/// Reads and discards `len` payload bytes, keeping the stream in step after a refused frame.
pub async fn skip<R: AsyncRead + Unpin>(r: &mut R, mut len: u64) -> std::io::Result<()> {
    let mut scratch = [0u8; 8192];
    while len > 0 {
        let n = (len as usize).min(scratch.len());
        r.read_exact(&mut scratch[..n]).await?;
        len -= n as u64;
    }
    Ok(())
}

/// Writes header, body and payload segments, retrying short vectored writes until everything is sent.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    h: &Header,
    body: &[u8],
    data: &[&[u8]],
) -> std::io::Result<()> {
    let hb = h.encode();
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(2 + data.len());
    slices.push(IoSlice::new(&hb));
    if !body.is_empty() {
        slices.push(IoSlice::new(body));
    }
    slices.extend(data.iter().filter(|d| !d.is_empty()).map(|d| IoSlice::new(d)));
    let mut bufs: &mut [IoSlice<'_>] = &mut slices;
    while !bufs.is_empty() {
        let n = w.write_vectored(bufs).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, n);
    }
    w.flush().await
}
