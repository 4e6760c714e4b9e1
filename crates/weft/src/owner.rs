//! `weft chown`'s OWNER: `USER`, `USER:GROUP`, `USER:` (the user's login group), `:GROUP`; names resolved through
//! this host's user database (NSS, via `nix`), numbers taken as ids.

use anyhow::{Context, Result, bail};
use nix::unistd::{Group, User};

/// The uid and gid to set (`None`: leave as is).
pub fn parse(spec: &str) -> Result<(Option<u32>, Option<u32>)> {
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if user.is_empty() && group.is_none_or(str::is_empty) {
        bail!("owner {spec:?} names neither a user nor a group");
    }
    let (uid, login_gid) = if user.is_empty() { (None, None) } else { resolve_user(user)? };
    let gid = match group {
        None => None,
        // "USER:": the user's login group, as chown(1).
        Some("") => Some(login_gid.with_context(|| format!("{user:?} has no login group here: name the group"))?),
        Some(g) => Some(resolve_group(g)?),
    };
    Ok((uid, gid))
}

/// (uid, login gid if known) of a user name or number.
fn resolve_user(user: &str) -> Result<(Option<u32>, Option<u32>)> {
    if let Ok(u) = User::from_name(user)
        && let Some(u) = u
    {
        return Ok((Some(u.uid.as_raw()), Some(u.gid.as_raw())));
    }
    match user.parse::<u32>() {
        Ok(uid) => {
            let gid = User::from_uid(uid.into()).ok().flatten().map(|u| u.gid.as_raw());
            Ok((Some(uid), gid))
        }
        Err(_) => bail!("no user named {user:?} on this host"),
    }
}

fn resolve_group(group: &str) -> Result<u32> {
    if let Ok(Some(g)) = Group::from_name(group) {
        return Ok(g.gid.as_raw());
    }
    group.parse::<u32>().map_err(|_| anyhow::anyhow!("no group named {group:?} on this host"))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn names_numbers_and_forms() {
        // root and its group exist on every Linux host.
        assert_eq!(parse("root").unwrap(), (Some(0), None));
        assert_eq!(parse("root:root").unwrap(), (Some(0), Some(0)));
        assert_eq!(parse("root:").unwrap(), (Some(0), Some(0)), "the login group");
        assert_eq!(parse(":root").unwrap(), (None, Some(0)));
        assert_eq!(parse("1234:5678").unwrap(), (Some(1234), Some(5678)));
        assert_eq!(parse(":42").unwrap(), (None, Some(42)));
        assert!(parse("").is_err());
        assert!(parse(":").is_err());
        assert!(parse("no-such-user-weft").is_err());
        assert!(parse("root:no-such-group-weft").is_err());
    }
}
