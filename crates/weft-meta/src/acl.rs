//! POSIX ACLs: the Linux `system.posix_acl_access` / `system.posix_acl_default` value format, its validation, and
//! the rules that keep an ACL and the mode bits coherent, as Linux's `fs/posix_acl.c` does.
//!
//! Why here, as pure functions: an ACL arrives as an attribute value from any client, so it is decoded and
//! checked completely before it is stored or used (the decoder is fuzzed: `fuzz/fuzz_targets/acl.rs`), and the
//! mode rules (`posix_acl_equiv_mode`, `__posix_acl_chmod`, `posix_acl_create_masq`, `posix_acl_permission`)
//! are subtle enough to test one by one.
//!
//! Format (docs/format.md §13, little-endian): `version u32 = 2`, then entries of `tag u16 | perm u16 | id u32`.
//! Tags: USER_OBJ 0x01, USER 0x02, GROUP_OBJ 0x04, GROUP 0x08, MASK 0x10, OTHER 0x20; perm: r 4, w 2, x 1; the
//! id is a uid (USER) or gid (GROUP), `u32::MAX` otherwise. A valid ACL has exactly one USER_OBJ, GROUP_OBJ and
//! OTHER, at most one MASK, a MASK whenever it has a USER or GROUP entry, and its entries in (tag, id) order
//! without repeats. An ACL of only the three base entries is "minimal": it says no more than the mode bits, so it
//! is stored as mode bits only.

/// The only version of the value format.
pub const ACL_VERSION: u32 = 2;
/// Bytes of the version header.
const HEADER_BYTES: usize = 4;
/// Bytes of one entry.
const ENTRY_BYTES: usize = 8;
/// The id of the entries that name no user or group.
pub const ACL_UNDEFINED_ID: u32 = u32::MAX;

/// The attribute holding a file's access ACL.
pub const ACCESS_XATTR: &str = "system.posix_acl_access";
/// The attribute holding a directory's default ACL (what new entries inherit).
pub const DEFAULT_XATTR: &str = "system.posix_acl_default";

/// An entry's tag, with its wire value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    UserObj = 0x01,
    User = 0x02,
    GroupObj = 0x04,
    Group = 0x08,
    Mask = 0x10,
    Other = 0x20,
}

impl Tag {
    fn from_u16(v: u16) -> Option<Tag> {
        Some(match v {
            0x01 => Tag::UserObj,
            0x02 => Tag::User,
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }

    /// USER and GROUP entries name an id; the others do not.
    fn is_named(self) -> bool {
        matches!(self, Tag::User | Tag::Group)
    }
}

/// One entry: a tag, its `rwx` bits (0..=7) and, for USER and GROUP, the uid or gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: Tag,
    pub perm: u32,
    pub id: u32,
}

/// A validated ACL (see the module doc for what valid means).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Entry>,
}

/// Why a value is not a valid ACL: answered as `Invalid` (EINVAL).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AclError {
    #[error("an ACL value is a 4-byte version and 8-byte entries, got {0} bytes")]
    Length(usize),
    #[error("unknown ACL version {0} (only 2 is known)")]
    Version(u32),
    #[error("unknown ACL entry tag {0:#x}")]
    Tag(u16),
    #[error("ACL entry permission {0:#x} has bits other than rwx")]
    Perm(u16),
    #[error("ACL entries are out of order or repeated at entry {0}")]
    Order(usize),
    #[error("an ACL needs exactly one user, group and other entry")]
    MissingBase,
    #[error("an ACL with named users or groups needs a mask entry")]
    MissingMask,
}

impl Acl {
    /// Decodes and validates a value. `Ok(None)` for a value of no entries (header only), which Linux takes as
    /// "no ACL" (setting it removes the ACL).
    pub fn decode(value: &[u8]) -> Result<Option<Acl>, AclError> {
        if value.len() < HEADER_BYTES || !(value.len() - HEADER_BYTES).is_multiple_of(ENTRY_BYTES) {
            return Err(AclError::Length(value.len()));
        }
        let version = u32::from_le_bytes([value[0], value[1], value[2], value[3]]);
        if version != ACL_VERSION {
            return Err(AclError::Version(version));
        }
        let mut entries = Vec::with_capacity((value.len() - HEADER_BYTES) / ENTRY_BYTES);
        for e in value[HEADER_BYTES..].chunks_exact(ENTRY_BYTES) {
            let tag_raw = u16::from_le_bytes([e[0], e[1]]);
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            let tag = Tag::from_u16(tag_raw).ok_or(AclError::Tag(tag_raw))?;
            if perm & !7 != 0 {
                return Err(AclError::Perm(perm));
            }
            // Linux ignores the id of the unnamed entries; normalising it keeps one encoding per ACL.
            let id = if tag.is_named() { id } else { ACL_UNDEFINED_ID };
            entries.push(Entry { tag, perm: u32::from(perm), id });
        }
        if entries.is_empty() {
            return Ok(None);
        }
        Acl::new(entries).map(Some)
    }

    /// An ACL of `entries`, validated.
    pub fn new(entries: Vec<Entry>) -> Result<Acl, AclError> {
        for (i, w) in entries.windows(2).enumerate() {
            let unnamed = !w[0].tag.is_named();
            // Strictly increasing (tag, id): sorted and no repeats; an unnamed tag appears once.
            if (w[0].tag, w[0].id) >= (w[1].tag, w[1].id) || (unnamed && w[0].tag == w[1].tag) {
                return Err(AclError::Order(i + 1));
            }
        }
        let has = |t: Tag| entries.iter().any(|e| e.tag == t);
        if !(has(Tag::UserObj) && has(Tag::GroupObj) && has(Tag::Other)) {
            return Err(AclError::MissingBase);
        }
        if (has(Tag::User) || has(Tag::Group)) && !has(Tag::Mask) {
            return Err(AclError::MissingMask);
        }
        Ok(Acl { entries })
    }

    /// The minimal ACL that says what `mode`'s permission bits say.
    pub fn from_mode(mode: u32) -> Acl {
        let e = |tag, perm| Entry { tag, perm, id: ACL_UNDEFINED_ID };
        Acl {
            entries: vec![e(Tag::UserObj, (mode >> 6) & 7), e(Tag::GroupObj, (mode >> 3) & 7), e(Tag::Other, mode & 7)],
        }
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The value as stored and sent.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + ENTRY_BYTES * self.entries.len());
        out.extend_from_slice(&ACL_VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&(e.tag as u16).to_le_bytes());
            // perm is at most 7 (checked at decode and by every rule that changes it).
            out.extend_from_slice(&((e.perm & 7) as u16).to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    fn perm_of(&self, tag: Tag) -> Option<u32> {
        self.entries.iter().find(|e| e.tag == tag).map(|e| e.perm)
    }

    fn set_perm(&mut self, tag: Tag, perm: u32) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.tag == tag) {
            e.perm = perm & 7;
        }
    }

    /// `posix_acl_equiv_mode`: the permission bits this ACL gives the mode (owner from USER_OBJ, group from MASK
    /// if present else GROUP_OBJ, other from OTHER) and whether the ACL is minimal (says nothing more).
    pub fn equiv_mode(&self) -> (u32, bool) {
        let user = self.perm_of(Tag::UserObj).unwrap_or(0);
        let other = self.perm_of(Tag::Other).unwrap_or(0);
        let mask = self.perm_of(Tag::Mask);
        let group = mask.or(self.perm_of(Tag::GroupObj)).unwrap_or(0);
        let minimal = mask.is_none() && !self.entries.iter().any(|e| e.tag.is_named());
        ((user << 6) | (group << 3) | other, minimal)
    }

    /// `__posix_acl_chmod`: a chmod to `mode` rewrites USER_OBJ, MASK (GROUP_OBJ when there is no mask) and OTHER.
    pub fn chmod(&mut self, mode: u32) {
        self.set_perm(Tag::UserObj, mode >> 6);
        if self.perm_of(Tag::Mask).is_some() {
            self.set_perm(Tag::Mask, mode >> 3);
        } else {
            self.set_perm(Tag::GroupObj, mode >> 3);
        }
        self.set_perm(Tag::Other, mode);
    }

    /// `posix_acl_create_masq`: this (inherited default) ACL becomes a new entry's access ACL, masked by its
    /// create `mode`, which is masked in turn by the ACL. Returns the new mode (special bits kept) and whether
    /// the ACL must be stored (it is not minimal).
    pub fn create_masq(&mut self, mode: u32) -> (u32, bool) {
        let mut m = mode & 0o777;
        let mut minimal = true;
        for e in &mut self.entries {
            match e.tag {
                Tag::UserObj => {
                    e.perm &= m >> 6;
                    m &= (e.perm << 6) | !0o700;
                }
                Tag::User | Tag::Group | Tag::Mask => minimal = false,
                Tag::GroupObj => {}
                Tag::Other => {
                    e.perm &= m & 7;
                    m &= e.perm | !0o007;
                }
            }
        }
        let group_tag = if self.perm_of(Tag::Mask).is_some() { Tag::Mask } else { Tag::GroupObj };
        let g = self.perm_of(group_tag).unwrap_or(0) & ((m >> 3) & 7);
        self.set_perm(group_tag, g);
        m &= (g << 3) | !0o070;
        ((mode & !0o777) | (m & 0o777), !minimal)
    }

    /// `posix_acl_permission`: whether this access ACL grants `want` (rwx bits) to a caller with `uid` and groups
    /// (`in_group`), the inode being owned by `owner_uid`/`owner_gid`. The owner is matched by USER_OBJ; a named
    /// user by its USER entry, masked; else every group entry that matches (the owning group by GROUP_OBJ, named
    /// groups) grants if one of them has all of `want`, masked, and refuses if none has; else OTHER.
    pub fn permits(&self, uid: u32, in_group: &dyn Fn(u32) -> bool, owner: (u32, u32), want: u32) -> bool {
        let want = want & 7;
        let mask = self.perm_of(Tag::Mask).unwrap_or(7);
        let mut found = false;
        for e in &self.entries {
            match e.tag {
                Tag::UserObj if uid == owner.0 => return e.perm & want == want,
                Tag::User if e.id == uid => return e.perm & mask & want == want,
                Tag::GroupObj | Tag::Group => {
                    let gid = if e.tag == Tag::GroupObj { owner.1 } else { e.id };
                    if in_group(gid) {
                        found = true;
                        if e.perm & want == want {
                            return e.perm & mask & want == want;
                        }
                    }
                }
                Tag::Other => return !found && e.perm & want == want,
                _ => {}
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(tag: Tag, perm: u32, id: u32) -> Entry {
        Entry { tag, perm, id }
    }

    const U: u32 = ACL_UNDEFINED_ID;

    /// user::rw-, user:1000:r-x, group::r--, group:50:rw-, mask::rwx, other::---
    fn rich() -> Acl {
        Acl::new(vec![
            e(Tag::UserObj, 6, U),
            e(Tag::User, 5, 1000),
            e(Tag::GroupObj, 4, U),
            e(Tag::Group, 6, 50),
            e(Tag::Mask, 7, U),
            e(Tag::Other, 0, U),
        ])
        .unwrap()
    }

    #[test]
    fn values_round_trip_byte_for_byte() {
        let acl = rich();
        let bytes = acl.encode();
        assert_eq!(bytes.len(), 4 + 6 * 8);
        assert_eq!(&bytes[..4], &[2, 0, 0, 0]);
        assert_eq!(&bytes[12..20], &[0x02, 0, 5, 0, 0xe8, 0x03, 0, 0], "tag USER, perm r-x, id 1000");
        assert_eq!(Acl::decode(&bytes).unwrap(), Some(acl));
        assert_eq!(Acl::decode(&2u32.to_le_bytes()).unwrap(), None, "header only: no ACL");
        // The ids of unnamed entries are normalised.
        let mut odd = Acl::from_mode(0o640).encode();
        odd[8..12].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(Acl::decode(&odd).unwrap(), Some(Acl::from_mode(0o640)));
    }

    #[test]
    fn bad_values_are_refused_with_the_reason() {
        let good = rich().encode();
        assert_eq!(Acl::decode(&[]), Err(AclError::Length(0)));
        assert_eq!(Acl::decode(&good[..good.len() - 1]), Err(AclError::Length(good.len() - 1)));
        let mut v = good.clone();
        v[0] = 1;
        assert_eq!(Acl::decode(&v), Err(AclError::Version(1)));
        let mut v = good.clone();
        v[4] = 0x40;
        assert_eq!(Acl::decode(&v), Err(AclError::Tag(0x40)));
        let mut v = good.clone();
        v[6] = 8;
        assert_eq!(Acl::decode(&v), Err(AclError::Perm(8)));
        // Out of order: the named user after the owning group.
        let swapped = vec![e(Tag::UserObj, 6, U), e(Tag::GroupObj, 4, U), e(Tag::User, 5, 1), e(Tag::Mask, 7, U)];
        assert_eq!(Acl::new(swapped), Err(AclError::Order(2)));
        let twice = vec![e(Tag::UserObj, 6, U), e(Tag::User, 5, 9), e(Tag::User, 4, 9), e(Tag::GroupObj, 4, U)];
        assert_eq!(Acl::new(twice), Err(AclError::Order(2)));
        let two_owners = vec![e(Tag::UserObj, 6, U), e(Tag::UserObj, 4, U), e(Tag::GroupObj, 4, U)];
        assert_eq!(Acl::new(two_owners), Err(AclError::Order(1)));
        assert_eq!(Acl::new(vec![e(Tag::UserObj, 6, U), e(Tag::Other, 4, U)]), Err(AclError::MissingBase));
        let no_mask = vec![e(Tag::UserObj, 6, U), e(Tag::User, 5, 1), e(Tag::GroupObj, 4, U), e(Tag::Other, 0, U)];
        assert_eq!(Acl::new(no_mask), Err(AclError::MissingMask));
    }

    #[test]
    fn equiv_mode_takes_the_group_bits_from_the_mask() {
        assert_eq!(Acl::from_mode(0o754).equiv_mode(), (0o754, true));
        assert_eq!(rich().equiv_mode(), (0o670, false), "user rw, mask rwx, other none");
    }

    #[test]
    fn chmod_rewrites_owner_mask_and_other_only() {
        let mut acl = rich();
        acl.chmod(0o7451);
        let perms: Vec<u32> = acl.entries().iter().map(|e| e.perm).collect();
        assert_eq!(perms, [4, 5, 4, 6, 5, 1], "USER_OBJ r, MASK r-x, OTHER x; named entries kept");
        let mut minimal = Acl::from_mode(0o600);
        minimal.chmod(0o640);
        assert_eq!(minimal, Acl::from_mode(0o640), "without a mask, GROUP_OBJ takes the group bits");
    }

    #[test]
    fn create_masq_masks_both_ways_as_linux() {
        // A default ACL rwx everywhere, created with 0644: the ACL narrows to the mode, mode from the mask.
        let mut acl = Acl::new(vec![
            e(Tag::UserObj, 7, U),
            e(Tag::User, 7, 1000),
            e(Tag::GroupObj, 5, U),
            e(Tag::Mask, 7, U),
            e(Tag::Other, 5, U),
        ])
        .unwrap();
        let (mode, store) = acl.create_masq(0o100644 & 0o7777 | 0o2000);
        assert!(store);
        assert_eq!(mode, 0o2644, "special bits kept; group bits = mask ∩ mode");
        let perms: Vec<u32> = acl.entries().iter().map(|e| e.perm).collect();
        assert_eq!(perms, [6, 7, 5, 4, 4], "USER_OBJ rw, named kept, GROUP_OBJ kept, MASK r, OTHER r");
        // A minimal default ACL narrower than the mode narrows the mode, and needs no stored ACL.
        let mut min = Acl::from_mode(0o750);
        assert_eq!(min.create_masq(0o777), (0o750, false));
    }

    #[test]
    fn permission_walks_every_entry_type() {
        let acl = rich();
        let owner = (500, 40);
        let groups = |gs: &'static [u32]| move |g: u32| gs.contains(&g);
        let ask = |uid: u32, gs: &'static [u32], want: u32| acl.permits(uid, &groups(gs), owner, want);
        // USER_OBJ: the owner gets rw, not x, whatever its groups.
        assert!(ask(500, &[50], 6) && !ask(500, &[50], 1));
        // USER: 1000 gets r-x (masked by rwx).
        assert!(ask(1000, &[], 5) && !ask(1000, &[], 2));
        // GROUP_OBJ: members of 40 get r only.
        assert!(ask(7, &[40], 4) && !ask(7, &[40], 2));
        // GROUP: members of 50 get rw; a member of both gets what either grants.
        assert!(ask(7, &[50], 6) && ask(7, &[40, 50], 6) && !ask(7, &[40, 50], 1));
        // OTHER: nothing; and a matching group that lacks the bits refuses even if OTHER had them.
        assert!(!ask(7, &[], 4));
        let mut lenient = rich();
        lenient.set_perm(Tag::Other, 7);
        assert!(lenient.permits(7, &groups(&[]), owner, 2));
        assert!(!lenient.permits(7, &groups(&[40]), owner, 2), "a group entry matched: OTHER is not consulted");
        // The mask limits named users and every group entry, not the owner or other.
        let mut masked = rich();
        masked.set_perm(Tag::Mask, 4);
        assert!(!masked.permits(1000, &groups(&[]), owner, 1));
        assert!(masked.permits(1000, &groups(&[]), owner, 4));
        assert!(!masked.permits(7, &groups(&[50]), owner, 2));
        assert!(masked.permits(500, &groups(&[]), owner, 6));
    }

    /// What the fuzz target asserts, on seeded random values shaped like ACLs (valid header, entries with tags
    /// and perms mostly in range), so accepted ACLs are common: decode never panics, accepted ACLs re-encode to
    /// themselves, and the mode rules stay within the mode.
    #[test]
    fn random_values_keep_the_fuzz_invariants() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut accepted = 0;
        for _ in 0..20_000 {
            // A well-formed shape (named entries sometimes, a mask sometimes), then perhaps damaged.
            let mut entries: Vec<(u16, u16, u32)> = vec![(0x01, 0, 0)];
            entries.extend((0..next() % 3).map(|k| (0x02, 0, 1000 + k as u32)));
            entries.push((0x04, 0, 0));
            entries.extend((0..next() % 3).map(|k| (0x08, 0, 50 + k as u32)));
            if next() % 4 != 0 {
                entries.push((0x10, 0, 0));
            }
            entries.push((0x20, 0, 0));
            for e in &mut entries {
                e.1 = (next() % 8) as u16;
            }
            match next() % 8 {
                0 => entries[0].1 = 8,
                1 => entries.swap(0, 1),
                2 => entries[1].0 = 0x40,
                3 => {
                    entries.remove(0);
                }
                _ => {}
            }
            let mut v = 2u32.to_le_bytes().to_vec();
            for (tag, perm, id) in entries {
                v.extend_from_slice(&tag.to_le_bytes());
                v.extend_from_slice(&perm.to_le_bytes());
                v.extend_from_slice(&id.to_le_bytes());
            }
            if next() % 10 == 0 {
                v.truncate((next() as usize) % (v.len() + 1));
            }
            let Ok(Some(acl)) = Acl::decode(&v) else { continue };
            accepted += 1;
            assert_eq!(Acl::decode(&acl.encode()), Ok(Some(acl.clone())));
            let mode = (next() % 0o10000) as u32;
            let mut c = acl.clone();
            c.chmod(mode);
            assert_eq!(c.equiv_mode().0, mode & 0o777);
            let mut m = acl.clone();
            let (new_mode, _) = m.create_masq(mode);
            assert_eq!((new_mode & !0o777, new_mode & 0o777 & !mode), (mode & !0o777, 0));
        }
        assert!(accepted > 100, "only {accepted} values were valid ACLs");
    }
}
