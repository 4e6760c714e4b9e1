//! XDR (RFC 4506) encoding and decoding: big-endian 4-byte units, opaque data padded to 4 bytes.
//!
//! The [`Reader`] checks every length against both the bytes left and a caller-given maximum before it copies
//! anything, so a hostile count (`0xffffffff`) is an error, never an allocation.

/// What is wrong with XDR input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum XdrError {
    #[error("truncated: {wanted} more bytes wanted at offset {at}")]
    Truncated { at: usize, wanted: usize },
    #[error("length {len} over the limit {max}")]
    TooLong { len: u64, max: usize },
    #[error("discriminant {0} is not one this union has")]
    BadDiscriminant(u32),
    #[error("a string is not UTF-8")]
    NotUtf8,
    #[error("a boolean is {0}, neither 0 nor 1")]
    BadBool(u32),
}

/// A cursor over one XDR-encoded message.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn padded(len: usize) -> usize {
    len.div_ceil(4) * 4
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The undecoded rest.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        if self.remaining() < n {
            return Err(XdrError::Truncated { at: self.pos, wanted: n });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u32(&mut self) -> Result<u32, XdrError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self) -> Result<u64, XdrError> {
        let hi = self.u32()? as u64;
        let lo = self.u32()? as u64;
        Ok(hi << 32 | lo)
    }

    pub fn bool(&mut self) -> Result<bool, XdrError> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(XdrError::BadBool(v)),
        }
    }

    /// Fixed-length opaque data of `n` bytes (plus padding).
    pub fn fixed(&mut self, n: usize) -> Result<&'a [u8], XdrError> {
        let s = self.take(padded(n))?;
        Ok(&s[..n])
    }

    /// Variable-length opaque data of at most `max` bytes.
    pub fn opaque(&mut self, max: usize) -> Result<&'a [u8], XdrError> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(XdrError::TooLong { len: len as u64, max });
        }
        self.fixed(len)
    }

    /// A string of at most `max` bytes, which must be UTF-8 (Weft's names are).
    pub fn string(&mut self, max: usize) -> Result<&'a str, XdrError> {
        std::str::from_utf8(self.opaque(max)?).map_err(|_| XdrError::NotUtf8)
    }
}

/// An XDR encoder appending to a byte vector, and optionally ending in one large opaque's bytes kept apart
/// ([`Writer::opaque_tail`]: a READ's data goes to the socket from the buffer it was read into, not copied).
#[derive(Debug, Default)]
pub struct Writer {
    pub buf: Vec<u8>,
    /// The bytes of a variable-length opaque whose length word ends `buf`; the encoding is `buf`, then `tail`,
    /// then `tail`'s padding ([`pad_of`]). Nothing may be written after it.
    pub tail: Option<bytes::Bytes>,
}

/// The zero bytes that pad `len` bytes of opaque data to a multiple of 4.
pub fn pad_of(len: usize) -> &'static [u8] {
    &[0u8; 3][..padded(len) - len]
}

impl Writer {
    pub fn new() -> Writer {
        Writer { buf: Vec::with_capacity(256), tail: None }
    }

    /// Variable-length opaque data as the last item: its length word is encoded now, its bytes stay where they
    /// are (see [`Writer::tail`]).
    pub fn opaque_tail(&mut self, b: bytes::Bytes) {
        assert!(b.len() <= u32::MAX as usize, "an XDR opaque is at most 4 GiB");
        assert!(self.tail.is_none(), "one tail per message");
        self.u32(b.len() as u32);
        self.tail = Some(b);
    }

    /// The whole encoding in one vector (copies the tail; for tests and small messages).
    pub fn into_vec(self) -> Vec<u8> {
        let mut v = self.buf;
        if let Some(t) = self.tail {
            v.extend_from_slice(&t);
            v.extend_from_slice(pad_of(t.len()));
        }
        v
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        debug_assert!(self.tail.is_none(), "nothing is written after the tail");
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        debug_assert!(self.tail.is_none(), "nothing is written after the tail");
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u32(v as u32)
    }

    /// Fixed-length opaque data, padded.
    pub fn fixed(&mut self, b: &[u8]) -> &mut Self {
        debug_assert!(self.tail.is_none(), "nothing is written after the tail");
        self.buf.extend_from_slice(b);
        self.buf.resize(self.buf.len() + padded(b.len()) - b.len(), 0);
        self
    }

    /// Variable-length opaque data (a string too).
    pub fn opaque(&mut self, b: &[u8]) -> &mut Self {
        assert!(b.len() <= u32::MAX as usize, "an XDR opaque is at most 4 GiB");
        self.u32(b.len() as u32);
        self.fixed(b)
    }

    /// Bytes encoded, the tail and its padding included.
    pub fn len(&self) -> usize {
        self.buf.len() + self.tail.as_ref().map_or(0, |t| padded(t.len()))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_padding() {
        let mut w = Writer::new();
        w.u32(7).u64(0x0102_0304_0506_0708).bool(true).opaque(b"abcde").fixed(b"xy");
        assert_eq!(w.len(), 4 + 8 + 4 + 4 + 8 + 4);
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.u32().unwrap(), 7);
        assert_eq!(r.u64().unwrap(), 0x0102_0304_0506_0708);
        assert!(r.bool().unwrap());
        assert_eq!(r.opaque(16).unwrap(), b"abcde");
        assert_eq!(r.fixed(2).unwrap(), b"xy");
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn a_tail_encodes_as_an_opaque() {
        for n in 0..9usize {
            let data: Vec<u8> = (0..n as u8).collect();
            let mut inline = Writer::new();
            inline.u32(1).opaque(&data);
            let mut tailed = Writer::new();
            tailed.u32(1).opaque_tail(bytes::Bytes::from(data.clone()));
            assert_eq!(tailed.len(), inline.len());
            assert_eq!(tailed.into_vec(), inline.buf, "{n} bytes");
        }
    }

    #[test]
    fn hostile_lengths_are_errors() {
        let mut w = Writer::new();
        w.u32(u32::MAX);
        assert!(matches!(Reader::new(&w.buf).opaque(1 << 20), Err(XdrError::TooLong { .. })));
        let mut w = Writer::new();
        w.u32(100).u32(0);
        assert!(matches!(Reader::new(&w.buf).opaque(1 << 20), Err(XdrError::Truncated { .. })));
        assert!(matches!(Reader::new(&[0, 0, 0, 2]).bool(), Err(XdrError::BadBool(2))));
        assert!(matches!(Reader::new(&[0, 0]).u32(), Err(XdrError::Truncated { .. })));
    }
}
