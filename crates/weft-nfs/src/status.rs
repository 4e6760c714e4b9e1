//! NFSv3 status codes (RFC 1813 §2.6) and the one mapping from Weft's errors to them.

use weft_client::ClientError;
use weft_proto::ErrorCode;

pub const NFS3_OK: u32 = 0;
pub const NFS3ERR_PERM: u32 = 1;
pub const NFS3ERR_NOENT: u32 = 2;
pub const NFS3ERR_IO: u32 = 5;
pub const NFS3ERR_NXIO: u32 = 6;
pub const NFS3ERR_ACCES: u32 = 13;
pub const NFS3ERR_EXIST: u32 = 17;
pub const NFS3ERR_XDEV: u32 = 18;
pub const NFS3ERR_NODEV: u32 = 19;
pub const NFS3ERR_NOTDIR: u32 = 20;
pub const NFS3ERR_ISDIR: u32 = 21;
pub const NFS3ERR_INVAL: u32 = 22;
pub const NFS3ERR_FBIG: u32 = 27;
pub const NFS3ERR_NOSPC: u32 = 28;
pub const NFS3ERR_ROFS: u32 = 30;
pub const NFS3ERR_MLINK: u32 = 31;
pub const NFS3ERR_NAMETOOLONG: u32 = 63;
pub const NFS3ERR_NOTEMPTY: u32 = 66;
pub const NFS3ERR_DQUOT: u32 = 69;
pub const NFS3ERR_STALE: u32 = 70;
pub const NFS3ERR_REMOTE: u32 = 71;
pub const NFS3ERR_BADHANDLE: u32 = 10001;
pub const NFS3ERR_NOT_SYNC: u32 = 10002;
pub const NFS3ERR_BAD_COOKIE: u32 = 10003;
pub const NFS3ERR_NOTSUPP: u32 = 10004;
pub const NFS3ERR_TOOSMALL: u32 = 10005;
pub const NFS3ERR_SERVERFAULT: u32 = 10006;
pub const NFS3ERR_BADTYPE: u32 = 10007;
pub const NFS3ERR_JUKEBOX: u32 = 10008;

/// The NFSv3 status of a Weft error code, as POSIX and RFC 1813 name the failure.
pub fn status_of_code(code: ErrorCode) -> u32 {
    match code {
        ErrorCode::NotFound => NFS3ERR_NOENT,
        ErrorCode::Exists => NFS3ERR_EXIST,
        ErrorCode::NotDir => NFS3ERR_NOTDIR,
        ErrorCode::IsDir => NFS3ERR_ISDIR,
        ErrorCode::NotEmpty => NFS3ERR_NOTEMPTY,
        ErrorCode::Invalid | ErrorCode::NotSymlink | ErrorCode::BadRequest => NFS3ERR_INVAL,
        ErrorCode::NameTooLong => NFS3ERR_NAMETOOLONG,
        ErrorCode::Permission | ErrorCode::CapabilityRefused | ErrorCode::CapabilityExpired => NFS3ERR_ACCES,
        ErrorCode::Unauthenticated => NFS3ERR_ACCES,
        ErrorCode::NotPermitted => NFS3ERR_PERM,
        ErrorCode::NoSpace | ErrorCode::NoServers => NFS3ERR_NOSPC,
        ErrorCode::OutOfRange => NFS3ERR_FBIG,
        // The client retries later: the cluster is out of a bounded resource, or a session is being rebuilt.
        ErrorCode::Busy | ErrorCode::StaleSession | ErrorCode::SeqMisordered => NFS3ERR_JUKEBOX,
        ErrorCode::NotSupported | ErrorCode::NoData | ErrorCode::Range | ErrorCode::TooBig => NFS3ERR_NOTSUPP,
        ErrorCode::Corrupt | ErrorCode::Io => NFS3ERR_IO,
        ErrorCode::Internal => NFS3ERR_SERVERFAULT,
        _ => NFS3ERR_SERVERFAULT,
    }
}

/// The NFSv3 status of a client-library error: the server's code if one answered; a lost cluster is
/// NFS3ERR_JUKEBOX (try again), a local refusal NFS3ERR_ACCES, a bad name NFS3ERR_INVAL.
pub fn status_of(e: &ClientError) -> u32 {
    if let Some(code) = e.code() {
        return status_of_code(code);
    }
    match e {
        ClientError::Path { error, .. } => status_of(error),
        ClientError::InvalidPath(_) => NFS3ERR_INVAL,
        ClientError::NotAFile(_) => NFS3ERR_INVAL,
        ClientError::Access(_) => NFS3ERR_ACCES,
        ClientError::Meta(_) | ClientError::Data { .. } | ClientError::UnknownServer(_) => NFS3ERR_JUKEBOX,
        _ => NFS3ERR_SERVERFAULT,
    }
}

/// A short name for logs.
pub fn status_name(s: u32) -> &'static str {
    match s {
        NFS3_OK => "OK",
        NFS3ERR_PERM => "PERM",
        NFS3ERR_NOENT => "NOENT",
        NFS3ERR_IO => "IO",
        NFS3ERR_ACCES => "ACCES",
        NFS3ERR_EXIST => "EXIST",
        NFS3ERR_XDEV => "XDEV",
        NFS3ERR_NOTDIR => "NOTDIR",
        NFS3ERR_ISDIR => "ISDIR",
        NFS3ERR_INVAL => "INVAL",
        NFS3ERR_FBIG => "FBIG",
        NFS3ERR_NOSPC => "NOSPC",
        NFS3ERR_ROFS => "ROFS",
        NFS3ERR_NAMETOOLONG => "NAMETOOLONG",
        NFS3ERR_NOTEMPTY => "NOTEMPTY",
        NFS3ERR_STALE => "STALE",
        NFS3ERR_BADHANDLE => "BADHANDLE",
        NFS3ERR_NOT_SYNC => "NOT_SYNC",
        NFS3ERR_BAD_COOKIE => "BAD_COOKIE",
        NFS3ERR_NOTSUPP => "NOTSUPP",
        NFS3ERR_TOOSMALL => "TOOSMALL",
        NFS3ERR_SERVERFAULT => "SERVERFAULT",
        NFS3ERR_BADTYPE => "BADTYPE",
        NFS3ERR_JUKEBOX => "JUKEBOX",
        _ => "?",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::WireError;
    use weft_rpc::RpcError;

    #[test]
    fn every_code_maps_to_the_posix_status() {
        let cases = [
            (ErrorCode::NotFound, NFS3ERR_NOENT),
            (ErrorCode::Exists, NFS3ERR_EXIST),
            (ErrorCode::NotDir, NFS3ERR_NOTDIR),
            (ErrorCode::IsDir, NFS3ERR_ISDIR),
            (ErrorCode::NotEmpty, NFS3ERR_NOTEMPTY),
            (ErrorCode::Invalid, NFS3ERR_INVAL),
            (ErrorCode::NameTooLong, NFS3ERR_NAMETOOLONG),
            (ErrorCode::Permission, NFS3ERR_ACCES),
            (ErrorCode::NotPermitted, NFS3ERR_PERM),
            (ErrorCode::NoSpace, NFS3ERR_NOSPC),
            (ErrorCode::OutOfRange, NFS3ERR_FBIG),
            (ErrorCode::Busy, NFS3ERR_JUKEBOX),
            (ErrorCode::Corrupt, NFS3ERR_IO),
            (ErrorCode::Io, NFS3ERR_IO),
            (ErrorCode::Internal, NFS3ERR_SERVERFAULT),
            (ErrorCode::NotSupported, NFS3ERR_NOTSUPP),
        ];
        for (code, want) in cases {
            assert_eq!(status_of_code(code), want, "{code:?}");
            // Agrees with the errno the FUSE mount reports for the same code (NFS took NAMETOOLONG and NOTEMPTY
            // from BSD's numbering, 63 and 66, where Linux has 36 and 39).
            if want < 60 {
                assert_eq!(want as i32, code.errno(), "{code:?}");
            }
        }
    }

    #[test]
    fn client_errors_map_through_their_code() {
        let remote = ClientError::Meta(RpcError::Remote(WireError::new(ErrorCode::NotEmpty, "x")));
        assert_eq!(status_of(&remote), NFS3ERR_NOTEMPTY);
        assert_eq!(status_of(&remote.with_path("/a")), NFS3ERR_NOTEMPTY);
        assert_eq!(status_of(&ClientError::Access("no".into())), NFS3ERR_ACCES);
        assert_eq!(status_of(&ClientError::InvalidPath("a//b".into())), NFS3ERR_INVAL);
        assert_eq!(status_name(NFS3ERR_STALE), "STALE");
    }
}
