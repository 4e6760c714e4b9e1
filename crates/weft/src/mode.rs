//! `weft chmod`'s MODE: octal, or symbolic clauses as chmod(1) reads them (`u+x,go-w`, `a=rX`, `g=u`, `+t`).

/// A MODE applied to a file's current permission bits gives the new ones (both without file-type bits).
/// `is_dir` matters for `X` (execute only for directories and files some class may already execute).
///
/// Grammar (chmod(1)): `[0-7]{1,4}` | clause (`,` clause)*; clause = `[ugoa]*` (op perms)+; op = `+` | `-` | `=`;
/// perms = `[rwxXst]*` | one of `u g o` (copy that class's current bits). Without `ugoa` a clause applies to all
/// classes (unlike chmod(1), the umask is not consulted: a remote file's mode is the caller's explicit choice).
pub fn apply(spec: &str, mode: u32, is_dir: bool) -> Result<u32, String> {
    if !spec.is_empty() && spec.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        if spec.len() > 4 {
            return Err(format!("octal mode {spec:?} has more than 4 digits"));
        }
        return u32::from_str_radix(spec, 8).map_err(|e| e.to_string());
    }
    let mut m = mode & 0o7777;
    for clause in spec.split(',') {
        m = apply_clause(clause, m, is_dir).map_err(|e| format!("invalid mode {spec:?}: {e}"))?;
    }
    Ok(m)
}

const SUID: u32 = 0o4000;
const SGID: u32 = 0o2000;
const STICKY: u32 = 0o1000;

fn apply_clause(clause: &str, mut m: u32, is_dir: bool) -> Result<u32, String> {
    let b = clause.as_bytes();
    let mut i = 0;
    // Each class's bits as a mask: rwx at its place, plus its special bit.
    let mut who = 0u32;
    while i < b.len() && matches!(b[i], b'u' | b'g' | b'o' | b'a') {
        who |= match b[i] {
            b'u' => 0o700 | SUID,
            b'g' => 0o070 | SGID,
            b'o' => 0o007 | STICKY,
            _ => 0o777 | SUID | SGID | STICKY,
        };
        i += 1;
    }
    if who == 0 {
        who = 0o777 | SUID | SGID | STICKY;
    }
    if i == b.len() {
        return Err(format!("clause {clause:?} has no operator (+, - or =)"));
    }
    while i < b.len() {
        let op = b[i];
        if !matches!(op, b'+' | b'-' | b'=') {
            return Err(format!("unexpected {:?} in {clause:?}", op as char));
        }
        i += 1;
        // The bits this operator names, for every class (masked by `who` below).
        let mut bits = 0u32;
        if i < b.len() && matches!(b[i], b'u' | b'g' | b'o') {
            let rwx = match b[i] {
                b'u' => (m >> 6) & 7,
                b'g' => (m >> 3) & 7,
                _ => m & 7,
            };
            bits = rwx * 0o111;
            i += 1;
        } else {
            while i < b.len() && matches!(b[i], b'r' | b'w' | b'x' | b'X' | b's' | b't') {
                bits |= match b[i] {
                    b'r' => 0o444,
                    b'w' => 0o222,
                    b'x' => 0o111,
                    // Execute where it makes sense: directories, and files some class can execute already.
                    b'X' if is_dir || m & 0o111 != 0 => 0o111,
                    b'X' => 0,
                    b's' => SUID | SGID,
                    _ => STICKY,
                };
                i += 1;
            }
        }
        let bits = bits & who;
        m = match op {
            b'+' => m | bits,
            b'-' => m & !bits,
            // `=` clears the named classes' bits: rwx and their special bit (u: set-user-ID, g: set-group-ID, o:
            // sticky), as chmod(1) does.
            _ => (m & !who) | bits,
        };
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::apply;

    #[test]
    fn octal() {
        assert_eq!(apply("755", 0o600, false), Ok(0o755));
        assert_eq!(apply("0", 0o777, false), Ok(0));
        assert_eq!(apply("4750", 0, false), Ok(0o4750));
        assert!(apply("77777", 0, false).is_err());
        assert!(apply("8", 0, false).is_err(), "not octal, not symbolic");
    }

    #[test]
    fn symbolic_like_chmod() {
        // Values checked against GNU chmod on a file (umask 0 for the who-less clauses).
        assert_eq!(apply("u+x,go-w", 0o666, false), Ok(0o744));
        assert_eq!(apply("a=r", 0o777, false), Ok(0o444));
        assert_eq!(apply("=rw", 0o7777, false), Ok(0o666));
        assert_eq!(apply("g=u", 0o640, false), Ok(0o660));
        assert_eq!(apply("o=g", 0o751, false), Ok(0o755));
        assert_eq!(apply("+x", 0o644, false), Ok(0o755));
        assert_eq!(apply("a-x", 0o755, false), Ok(0o644));
        assert_eq!(apply("u+s,g+s", 0o755, false), Ok(0o6755));
        assert_eq!(apply("o+t", 0o777, true), Ok(0o1777));
        assert_eq!(apply("+t", 0o777, true), Ok(0o1777));
        assert_eq!(apply("u=rwx,g=rx,o=", 0o000, false), Ok(0o750));
        assert_eq!(apply("u-s", 0o4755, false), Ok(0o755));
        assert_eq!(apply("go=", 0o4777, false), Ok(0o4700), "g= keeps u's setuid");
        assert_eq!(apply("u+r-w+x", 0o200, false), Ok(0o500), "several operators in one clause");
    }

    #[test]
    fn capital_x_only_for_directories_and_executables() {
        assert_eq!(apply("a+X", 0o644, false), Ok(0o644));
        assert_eq!(apply("a+X", 0o744, false), Ok(0o755));
        assert_eq!(apply("a+X", 0o644, true), Ok(0o755));
        assert_eq!(apply("a=rX", 0o600, true), Ok(0o555));
    }

    #[test]
    fn bad_modes_are_refused() {
        for bad in ["", "u", "u+z", "q+x", "u+x,", "+x,,-w", "u*x"] {
            assert!(apply(bad, 0o644, false).is_err(), "{bad:?}");
        }
    }
}
