//! Cache keys and the sealed value around every cached payload (docs/format.md §12).
//!
//! memcached holds whatever anyone `set`s: a value is used only when its header checks and its AES-256-GCM seal
//! opens under the bank key with the header and the memcached key it was found under as associated data
//! ([`crate::seal`]), so a corrupt, truncated, foreign, moved or forged item is a miss, never data, and a
//! bystander reads nothing from one.

use std::fmt::Write as _;

use bytes::Bytes;

use crate::seal::{BankKey, NONCE_BYTES, TAG_BYTES};

/// Bytes of the value header before the sealed payload.
pub const HEADER_BYTES: usize = 24;
/// The largest whole item we store: memcached's default item limit (1 MiB) counts its own item header and the
/// key too, so keep 1 KiB of slack.
pub const VALUE_BYTES_MAX: usize = (1 << 20) - 1024;
/// The largest payload one item carries (the header before it, the seal's tag after it).
pub const PAYLOAD_BYTES_MAX: usize = VALUE_BYTES_MAX - HEADER_BYTES - TAG_BYTES;
/// memcached's key length limit.
pub const KEY_BYTES_MAX: usize = 250;

const _: () = assert!(HEADER_BYTES + KEY_BYTES_MAX <= crate::seal::AAD_BYTES_MAX, "seal.rs joins a header and a key");

const MAGIC: [u8; 4] = *b"WFCV";
/// Version 2: sealed (AES-256-GCM). Version 1 (a CRC-32C, readable and writable by anyone) is refused.
const VERSION: u8 = 2;

/// What an item caches; its code is byte 5 of the value and its letter is in the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ItemKind {
    /// A data block of a file at one data version.
    Block = 1,
    /// An inode's attributes (pushed by the MDS on every change; payload [`AttrItem`]).
    Attrs = 2,
    /// A directory entry: (parent, name) → child inode (pushed by the MDS; payload [`LookupItem`]).
    Lookup = 3,
}

impl ItemKind {
    fn letter(self) -> char {
        match self {
            ItemKind::Block => 'b',
            ItemKind::Attrs => 'a',
            ItemKind::Lookup => 'l',
        }
    }
}

/// What is cached, named so that an item never changes meaning: a key carries the version of what it holds, so a
/// newer version is a new key and an old item is simply never asked for again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheKey {
    /// Block `block` (object offset / block_bytes) of inode `ino`'s object on data server `server` (its id), at
    /// `data_version`. Per object, so a data server names what it read from facts it holds (its id, and the data
    /// version sealed in the read's capability) without knowing the layout; a reader finds the id in its layout.
    /// Used only when block_bytes divides the file's stripe unit (a block never straddles two objects).
    Block { ino: u64, data_version: u64, server: u32, block: u64 },
    /// Attributes of inode `ino`: overwritten in place by the MDS on each change (no version in the key: a client
    /// cannot know the current one), so their staleness is bounded by the push and by the item's expiry.
    Attrs { ino: u64 },
    /// The entry whose name's keyed hash is `name_hash` ([`BankKey::name_hash`]: a name may be 255 bytes, a
    /// memcached key only 250, and a plain hash would give names away to a dictionary) in directory `parent`;
    /// the payload carries the whole name, checked on read.
    Lookup { parent: u64, name_hash: [u8; 16] },
}

impl CacheKey {
    pub fn kind(&self) -> ItemKind {
        match self {
            CacheKey::Block { .. } => ItemKind::Block,
            CacheKey::Attrs { .. } => ItemKind::Attrs,
            CacheKey::Lookup { .. } => ItemKind::Lookup,
        }
    }

    /// The key of the entry `name` in directory `parent`, under the bank key `seal`.
    pub fn lookup(parent: u64, name: &str, seal: &BankKey) -> CacheKey {
        CacheKey::Lookup { parent, name_hash: seal.name_hash(name) }
    }

    /// The memcached key under cache namespace `namespace` (at most 82 ASCII bytes, no space or control byte).
    pub fn encode(&self, namespace: u64) -> String {
        let mut s = String::with_capacity(80);
        let _ = write!(s, "wf2/{namespace:x}/{}", self.kind().letter());
        match *self {
            CacheKey::Block { ino, data_version, server, block } => {
                let _ = write!(s, "/{ino:x}/{data_version:x}/{server:x}/{block:x}");
            }
            CacheKey::Attrs { ino } => {
                let _ = write!(s, "/{ino:x}");
            }
            CacheKey::Lookup { parent, name_hash } => {
                let _ = write!(s, "/{parent:x}/");
                for b in name_hash {
                    let _ = write!(s, "{b:02x}");
                }
            }
        }
        debug_assert!(s.len() <= KEY_BYTES_MAX);
        s
    }
}

/// The first 8 bytes of SHA-256 of the key: where it goes on the ring ([`crate::ring`]).
pub fn key_hash(key: &[u8]) -> u64 {
    let d = ring::digest::digest(&ring::digest::SHA256, key);
    let mut b = [0u8; 8];
    b.copy_from_slice(&d.as_ref()[..8]);
    u64::from_le_bytes(b)
}

/// Why an item is not used (each is a miss to the caller; the reason is for counters and logs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValueError {
    #[error("item of {0} bytes is shorter than the header and tag")]
    Short(usize),
    #[error("bad magic")]
    Magic,
    #[error("unknown value version {0}")]
    Version(u8),
    #[error("kind {found} where {expected:?} was asked for")]
    Kind { found: u8, expected: ItemKind },
    #[error("reserved bytes are not zero")]
    Reserved,
    #[error("payload length {stated} but {actual} bytes follow the header")]
    Length { stated: u32, actual: usize },
    #[error("the seal does not open under the bank key for this key (forged, corrupt, or moved from another key)")]
    Forged,
    #[error("payload of {0} bytes exceeds the item limit")]
    TooLarge(usize),
    #[error("no random nonce to seal with")]
    NoNonce,
}

/// Builds the sealed value for `payload` stored under `key` (the encoded key's bytes).
pub fn encode_value(key: &[u8], kind: ItemKind, payload: &[u8], seal: &BankKey) -> Result<Vec<u8>, ValueError> {
    let nonce = seal.nonce().map_err(|_| ValueError::NoNonce)?;
    encode_value_with_nonce(key, kind, payload, seal, nonce)
}

/// [`encode_value`] with a given nonce: for tests and the fuzzer, which re-encode what they decoded. A nonce
/// must never seal two values under one key: everything else draws it fresh.
#[doc(hidden)]
pub fn encode_value_with_nonce(
    key: &[u8],
    kind: ItemKind,
    payload: &[u8],
    seal: &BankKey,
    nonce: [u8; NONCE_BYTES],
) -> Result<Vec<u8>, ValueError> {
    if payload.len() > PAYLOAD_BYTES_MAX {
        return Err(ValueError::TooLarge(payload.len()));
    }
    let mut v = Vec::with_capacity(HEADER_BYTES + payload.len() + TAG_BYTES);
    v.extend_from_slice(&MAGIC);
    v.push(VERSION);
    v.push(kind as u8);
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(&nonce);
    // Checked above: the payload fits in 1 MiB, so in a u32.
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    let (header, body) = v.split_at_mut(HEADER_BYTES);
    let tag = seal.seal(nonce, header, key, body);
    v.extend_from_slice(&tag);
    Ok(v)
}

/// Opens `item`, found under the memcached key `key`, as a value of `kind`, in place: its payload (a slice of
/// the item's own buffer, no copy).
pub fn open_value(mut item: Vec<u8>, kind: ItemKind, key: &[u8], seal: &BankKey) -> Result<Bytes, ValueError> {
    let (len, nonce) = decode_header(&item, kind)?;
    let (header, body) = item.split_at_mut(HEADER_BYTES);
    if !seal.open(nonce, header, key, body) {
        return Err(ValueError::Forged);
    }
    Ok(Bytes::from(item).slice(HEADER_BYTES..HEADER_BYTES + len))
}

/// The header checks of [`open_value`] (everything but the seal); returns the payload length and the nonce.
pub fn decode_header(item: &[u8], kind: ItemKind) -> Result<(usize, [u8; NONCE_BYTES]), ValueError> {
    if item.len() < HEADER_BYTES + TAG_BYTES {
        return Err(ValueError::Short(item.len()));
    }
    if item[0..4] != MAGIC {
        return Err(ValueError::Magic);
    }
    if item[4] != VERSION {
        return Err(ValueError::Version(item[4]));
    }
    if item[5] != kind as u8 {
        return Err(ValueError::Kind { found: item[5], expected: kind });
    }
    if item[6..8] != [0, 0] {
        return Err(ValueError::Reserved);
    }
    let nonce: [u8; NONCE_BYTES] = item[8..20].try_into().expect("12 bytes");
    let stated = u32::from_le_bytes(item[20..24].try_into().expect("4 bytes"));
    let actual = item.len() - HEADER_BYTES - TAG_BYTES;
    if usize::try_from(stated).ok() != Some(actual) {
        return Err(ValueError::Length { stated, actual });
    }
    if actual > PAYLOAD_BYTES_MAX {
        return Err(ValueError::TooLarge(actual));
    }
    Ok((actual, nonce))
}

/// Version byte that starts the payload of an attributes or lookup item.
const ITEM_PAYLOAD_VERSION: u8 = 1;

/// Why an attributes or lookup payload is not used (a miss to the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PayloadError {
    #[error("empty payload")]
    Empty,
    #[error("unknown payload version {0}")]
    Version(u8),
    #[error("payload does not decode: {0}")]
    Decode(String),
    #[error("{0} trailing bytes after the payload")]
    Trailing(usize),
    #[error("item for inode {found} under the key of inode {expected}")]
    WrongInode { expected: u64, found: u64 },
    #[error("entry named {found:?} under the key of {expected:?} (a name-hash collision or a foreign item)")]
    WrongName { expected: String, found: String },
}

/// The payload of an [`ItemKind::Attrs`] item: version 1, then the postcard `Attr` (docs/format.md §12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttrItem(pub weft_proto::Attr);

/// The payload of an [`ItemKind::Lookup`] item: version 2, then the postcard `(name: String, ino: u64, attr:
/// Option<Attr>)` (version 1, still read, has no `attr`). `attr` is the child's attributes when the name is the
/// child's sole name (the MDS refreshes this entry with every change of them); `None` when the child may have
/// other names (hard links), whose entries the MDS could not all refresh: its attributes then live only under
/// its own [`CacheKey::Attrs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupItem {
    pub name: String,
    pub ino: u64,
    pub attr: Option<weft_proto::Attr>,
}

/// The lookup payload's version with the child's attributes.
const LOOKUP_PAYLOAD_VERSION: u8 = 2;

fn versioned<T: serde::Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![ITEM_PAYLOAD_VERSION];
    // Serializing plain data into a Vec cannot fail.
    out.extend_from_slice(&postcard::to_stdvec(v).expect("postcard encoding of plain data"));
    out
}

fn unversioned<'a, T: serde::Deserialize<'a>>(payload: &'a [u8]) -> Result<T, PayloadError> {
    let (&version, body) = payload.split_first().ok_or(PayloadError::Empty)?;
    if version != ITEM_PAYLOAD_VERSION {
        return Err(PayloadError::Version(version));
    }
    let (v, rest) = postcard::take_from_bytes(body).map_err(|e| PayloadError::Decode(e.to_string()))?;
    if !rest.is_empty() {
        return Err(PayloadError::Trailing(rest.len()));
    }
    Ok(v)
}

impl AttrItem {
    pub fn encode(&self) -> Vec<u8> {
        versioned(&self.0)
    }

    /// The attributes in `payload`, which was found under the attributes key of inode `ino`.
    pub fn decode(payload: &[u8], ino: u64) -> Result<weft_proto::Attr, PayloadError> {
        let attr: weft_proto::Attr = unversioned(payload)?;
        if attr.ino != ino {
            return Err(PayloadError::WrongInode { expected: ino, found: attr.ino });
        }
        Ok(attr)
    }
}

impl LookupItem {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![LOOKUP_PAYLOAD_VERSION];
        // Serializing plain data into a Vec cannot fail.
        let body = postcard::to_stdvec(&(&self.name, self.ino, &self.attr)).expect("postcard encoding of plain data");
        out.extend_from_slice(&body);
        out
    }

    /// The entry in `payload`, which was found under the lookup key of `name` (in some directory): the child's
    /// inode, and its attributes when the entry carries them (checked to be that inode's).
    pub fn decode(payload: &[u8], name: &str) -> Result<(u64, Option<weft_proto::Attr>), PayloadError> {
        let (found, ino, attr): (String, u64, Option<weft_proto::Attr>) = match payload.first() {
            Some(&LOOKUP_PAYLOAD_VERSION) => {
                let (v, rest) =
                    postcard::take_from_bytes(&payload[1..]).map_err(|e| PayloadError::Decode(e.to_string()))?;
                if !rest.is_empty() {
                    return Err(PayloadError::Trailing(rest.len()));
                }
                v
            }
            _ => {
                let (found, ino): (String, u64) = unversioned(payload)?;
                (found, ino, None)
            }
        };
        if found != name {
            return Err(PayloadError::WrongName { expected: name.to_string(), found });
        }
        if let Some(a) = &attr
            && a.ino != ino
        {
            return Err(PayloadError::WrongInode { expected: ino, found: a.ino });
        }
        Ok((ino, attr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(ino: u64) -> CacheKey {
        CacheKey::Block { ino, data_version: 7, server: 2, block: 3 }
    }

    fn bank_key() -> BankKey {
        BankKey::from_secret(&[7; 32])
    }

    #[test]
    fn keys_are_short_ascii_and_distinct() {
        let seal = bank_key();
        let k = block(0x42).encode(0xabc);
        assert_eq!(k, "wf2/abc/b/42/7/2/3");
        let longest = CacheKey::Block { ino: u64::MAX, data_version: u64::MAX, server: u32::MAX, block: u64::MAX }
            .encode(u64::MAX);
        assert_eq!(longest.len(), 82);
        // Each field is its own path segment: (server 1, block 0x23) and (server 0x12, block 3) differ.
        let a = CacheKey::Block { ino: 1, data_version: 1, server: 1, block: 0x23 }.encode(0);
        let b = CacheKey::Block { ino: 1, data_version: 1, server: 0x12, block: 3 }.encode(0);
        assert_ne!(a, b);
        assert!(longest.bytes().all(|b| b.is_ascii_graphic()));
        assert_ne!(block(1).encode(0), CacheKey::Attrs { ino: 1 }.encode(0));
        assert_eq!(CacheKey::Attrs { ino: 0x1f }.encode(0xabc), "wf2/abc/a/1f");
        // The name's part is keyed: no SHA-256("x") = 2d711642… a dictionary could match.
        let x = CacheKey::lookup(2, "x", &seal).encode(0xabc);
        assert!(x.starts_with("wf2/abc/l/2/") && x.len() == 12 + 32, "{x}");
        assert!(!x.contains("2d711642"), "{x}");
        assert_ne!(x, CacheKey::lookup(2, "x", &BankKey::from_secret(&[8; 32])).encode(0xabc));
        let long = "n".repeat(255);
        let k = CacheKey::lookup(u64::MAX, &long, &seal).encode(i64::MAX as u64);
        assert!(k.len() <= KEY_BYTES_MAX && k.bytes().all(|b| b.is_ascii_graphic()), "{k}");
        assert_ne!(CacheKey::lookup(1, "a", &seal).encode(0), CacheKey::lookup(1, "b", &seal).encode(0));
        assert_ne!(CacheKey::lookup(1, "a", &seal).encode(0), CacheKey::lookup(2, "a", &seal).encode(0));
        assert_ne!(block(1).encode(0), block(1).encode(1), "namespaces separate clusters");
    }

    #[test]
    fn round_trip_and_the_payload_is_not_in_the_clear() {
        let seal = bank_key();
        let key = block(9).encode(1);
        let v = encode_value(key.as_bytes(), ItemKind::Block, b"hello, secret", &seal).unwrap();
        assert_eq!(v.len(), HEADER_BYTES + 13 + TAG_BYTES);
        assert!(!v.windows(6).any(|w| w == b"secret"), "sealed, not readable");
        let p = open_value(v.clone(), ItemKind::Block, key.as_bytes(), &seal).unwrap();
        assert_eq!(&p[..], b"hello, secret");
        let again = encode_value(key.as_bytes(), ItemKind::Block, b"hello, secret", &seal).unwrap();
        assert_ne!(v, again, "a fresh nonce each time");
        let empty = encode_value(key.as_bytes(), ItemKind::Block, b"", &seal).unwrap();
        assert!(open_value(empty, ItemKind::Block, key.as_bytes(), &seal).unwrap().is_empty());
    }

    #[test]
    fn every_refusal() {
        let seal = bank_key();
        let key = block(9).encode(1);
        let good = encode_value(key.as_bytes(), ItemKind::Block, b"payload", &seal).unwrap();
        let check = |v: &[u8]| open_value(v.to_vec(), ItemKind::Block, key.as_bytes(), &seal).map(|p| p.len());
        assert_eq!(check(&good), Ok(7));
        assert_eq!(check(&good[..10]), Err(ValueError::Short(10)));
        let mut v = good.clone();
        v[0] = b'X';
        assert_eq!(check(&v), Err(ValueError::Magic));
        let mut v = good.clone();
        v[4] = 1;
        assert_eq!(check(&v), Err(ValueError::Version(1)), "version 1, the unsealed format, is refused");
        assert!(matches!(
            open_value(good.clone(), ItemKind::Attrs, key.as_bytes(), &seal),
            Err(ValueError::Kind { found: 1, .. })
        ));
        let mut v = good.clone();
        v[7] = 1;
        assert_eq!(check(&v), Err(ValueError::Reserved));
        let other = block(10).encode(1);
        assert_eq!(
            open_value(good.clone(), ItemKind::Block, other.as_bytes(), &seal),
            Err(ValueError::Forged),
            "a sealed item copied under another key"
        );
        let stranger = BankKey::from_secret(&[9; 32]);
        assert_eq!(open_value(good.clone(), ItemKind::Block, key.as_bytes(), &stranger), Err(ValueError::Forged));
        assert!(matches!(check(&good[..good.len() - 1]), Err(ValueError::Length { stated: 7, actual: 6 })));
        let mut v = good.clone();
        v.push(0);
        assert!(matches!(check(&v), Err(ValueError::Length { .. })));
        // Every single bit of the header, payload and tag is covered.
        for byte in 0..good.len() {
            let mut v = good.clone();
            v[byte] ^= 0x10;
            assert!(check(&v).is_err(), "byte {byte} flipped");
        }
        assert!(matches!(
            encode_value(key.as_bytes(), ItemKind::Block, &vec![0; PAYLOAD_BYTES_MAX + 1], &seal),
            Err(ValueError::TooLarge(_))
        ));
        let biggest = encode_value(key.as_bytes(), ItemKind::Block, &vec![0; PAYLOAD_BYTES_MAX], &seal).unwrap();
        assert_eq!(biggest.len(), VALUE_BYTES_MAX);
    }

    fn attr(ino: u64) -> weft_proto::Attr {
        weft_proto::Attr {
            ino,
            kind: weft_proto::FileKind::File,
            mode: 0o640,
            uid: 1000,
            gid: 100,
            nlink: 1,
            size: 12345,
            atime_ns: 1,
            mtime_ns: -2,
            ctime_ns: 3,
            layout: None,
            rdev: 0,
            data_version: 9,
        }
    }

    #[test]
    fn attr_items_round_trip_and_refuse_what_is_not_theirs() {
        let a = attr(77);
        let p = AttrItem(a.clone()).encode();
        assert_eq!(p[0], 1, "payload version first");
        assert_eq!(AttrItem::decode(&p, 77), Ok(a));
        assert_eq!(AttrItem::decode(&p, 78), Err(PayloadError::WrongInode { expected: 78, found: 77 }));
        assert_eq!(AttrItem::decode(&[], 77), Err(PayloadError::Empty));
        let mut v = p.clone();
        v[0] = 9;
        assert_eq!(AttrItem::decode(&v, 77), Err(PayloadError::Version(9)));
        let mut v = p.clone();
        v.push(0);
        assert_eq!(AttrItem::decode(&v, 77), Err(PayloadError::Trailing(1)));
        assert!(matches!(AttrItem::decode(&p[..p.len() - 1], 77), Err(PayloadError::Decode(_))));
        for cut in 1..p.len() {
            assert!(AttrItem::decode(&p[..cut], 77).is_err(), "a truncated payload of {cut} bytes");
        }
    }

    #[test]
    fn lookup_items_round_trip_and_check_the_name() {
        let p = LookupItem { name: "report.txt".into(), ino: 5, attr: None }.encode();
        assert_eq!(p[0], 2, "payload version first");
        assert_eq!(LookupItem::decode(&p, "report.txt"), Ok((5, None)));
        assert!(matches!(LookupItem::decode(&p, "other"), Err(PayloadError::WrongName { .. })));
        assert!(LookupItem::decode(&p[..p.len() - 1], "report.txt").is_err());
        // With the child's attributes, which must be the named inode's.
        let with = LookupItem { name: "report.txt".into(), ino: 5, attr: Some(attr(5)) }.encode();
        assert_eq!(LookupItem::decode(&with, "report.txt"), Ok((5, Some(attr(5)))));
        for cut in 1..with.len() {
            assert!(LookupItem::decode(&with[..cut], "report.txt").is_err(), "a truncated payload of {cut} bytes");
        }
        let mut long = with.clone();
        long.push(0);
        assert_eq!(LookupItem::decode(&long, "report.txt"), Err(PayloadError::Trailing(1)));
        let foreign = LookupItem { name: "report.txt".into(), ino: 5, attr: Some(attr(6)) }.encode();
        assert_eq!(LookupItem::decode(&foreign, "report.txt"), Err(PayloadError::WrongInode { expected: 5, found: 6 }));
        // Version 1 (no attributes) still reads.
        let mut v1 = vec![1];
        v1.extend(postcard::to_stdvec(&("report.txt", 5u64)).unwrap());
        assert_eq!(LookupItem::decode(&v1, "report.txt"), Ok((5, None)));
        let mut v9 = p.clone();
        v9[0] = 9;
        assert_eq!(LookupItem::decode(&v9, "report.txt"), Err(PayloadError::Version(9)));
        let attrs = AttrItem(attr(5)).encode();
        assert!(LookupItem::decode(&attrs, "report.txt").is_err(), "an attributes payload is no entry");
        // Under the value header, the kind keeps the two apart anyway.
        let seal = bank_key();
        let key = CacheKey::lookup(1, "report.txt", &seal).encode(0);
        let v = encode_value(key.as_bytes(), ItemKind::Lookup, &p, &seal).unwrap();
        assert!(matches!(decode_header(&v, ItemKind::Attrs), Err(ValueError::Kind { .. })));
        assert_eq!(decode_header(&v, ItemKind::Lookup).map(|(len, _)| len), Ok(p.len()));
    }
}
