//! Certificates for TLS on the `tcp` fabric (docs/format.md §11), made with rcgen: a cluster CA
//! (`ca.pem`, `ca.key`) and server certificates signed by it (`server.pem`, `server.key`). `weft up --tls` makes
//! both in `DATA_DIR/tls/` unless present; `weft tls ca` and `weft tls cert` make them for a multi-machine
//! cluster. Keys are ECDSA P-256, written PEM (PKCS#8) with mode 0600.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The CA certificate's file name in a CA directory (and the file every role names as `tls_ca_file`).
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA's private key: only `weft tls cert` reads it; never give it to a server.
pub const CA_KEY_FILE: &str = "ca.key";
/// A server's certificate (leaf), named by `tls_cert_file`.
pub const SERVER_CERT_FILE: &str = "server.pem";
/// A server's private key, named by `tls_key_file`.
pub const SERVER_KEY_FILE: &str = "server.key";
/// The CA's subject starts with this; a random suffix makes each cluster's CA distinct, so a certificate of
/// another cluster's CA is refused as coming from an unknown issuer (not as a bad signature of a same-named one).
const CA_COMMON_NAME: &str = "Weft cluster CA";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} exists; remove it first to make a new one")]
    Exists { path: PathBuf },
    #[error("making a certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("{0}")]
    Name(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CertError + '_ {
    move |source| CertError::Io { path: path.to_path_buf(), source }
}

/// Writes `text` to a new file with `mode` (never over an existing one).
fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), CertError> {
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            CertError::Exists { path: path.to_path_buf() }
        } else {
            CertError::Io { path: path.to_path_buf(), source: e }
        }
    })?;
    f.write_all(text.as_bytes()).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

/// The CA's certificate parameters; its name ends with 8 bytes of its (fresh, random) public key in hex.
fn ca_params(key: &KeyPair) -> Result<CertificateParams, CertError> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    let id: String = key.public_key_raw().iter().rev().take(8).map(|b| format!("{b:02x}")).collect();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, format!("{CA_COMMON_NAME} {id}"));
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2124, 1, 1);
    Ok(p)
}

/// Makes a new CA in `dir` (`ca.pem`, and `ca.key` with mode 0600); refuses to overwrite either.
pub fn make_ca(dir: &Path) -> Result<(), CertError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let key = KeyPair::generate()?;
    let cert = ca_params(&key)?.self_signed(&key)?;
    write_new(&dir.join(CA_KEY_FILE), &key.serialize_pem(), 0o600)?;
    write_new(&dir.join(CA_CERT_FILE), &cert.pem(), 0o644)
}

/// Makes a server certificate for `names` (DNS names or IP addresses; the first is also its common name) signed
/// by the CA in `ca_dir` (`ca.pem` and `ca.key`; any CA, not only one made here), into `out` (`server.pem`, and `server.key` with mode 0600); refuses to overwrite.
pub fn make_server_cert(ca_dir: &Path, names: &[String], out: &Path) -> Result<(), CertError> {
    let first = names.first().ok_or_else(|| CertError::Name("a certificate needs at least one name".into()))?;
    let ca_key_path = ca_dir.join(CA_KEY_FILE);
    let ca_key_pem = std::fs::read_to_string(&ca_key_path).map_err(io_err(&ca_key_path))?;
    let ca_key = KeyPair::from_pem(&ca_key_pem)?;
    let ca_cert_path = ca_dir.join(CA_CERT_FILE);
    let ca_pem = std::fs::read_to_string(&ca_cert_path).map_err(io_err(&ca_cert_path))?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, first.as_str());
    for name in names {
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                name.clone().try_into().map_err(|e| CertError::Name(format!("{name:?} is not a DNS name: {e}")))?,
            ),
        };
        p.subject_alt_names.push(san);
    }
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2124, 1, 1);
    let key = KeyPair::generate()?;
    let cert = p.signed_by(&key, &issuer)?;
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    write_new(&out.join(SERVER_KEY_FILE), &key.serialize_pem(), 0o600)?;
    write_new(&out.join(SERVER_CERT_FILE), &cert.pem(), 0o644)
}

/// The names a local (loopback) cluster's server certificate covers: 127.0.0.1, ::1, localhost and this host's
/// name.
pub fn local_names() -> Vec<String> {
    let mut names = vec!["127.0.0.1".to_string(), "::1".to_string(), "localhost".to_string()];
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty() && h != "localhost" && rcgen::string::Ia5String::try_from(h).is_ok() {
            names.push(h.to_string());
        }
    }
    names
}

/// The files of a local cluster's TLS in `dir` (`DATA_DIR/tls`): a CA and one server certificate for
/// [`local_names`], made unless `ca.pem` is there already.
pub fn ensure_local(dir: &Path) -> Result<weft_fabric::TlsFiles, CertError> {
    if !dir.join(CA_CERT_FILE).exists() {
        make_ca(dir)?;
    }
    if !dir.join(SERVER_CERT_FILE).exists() {
        make_server_cert(dir, &local_names(), dir)?;
    }
    Ok(weft_fabric::TlsFiles {
        ca_file: Some(dir.join(CA_CERT_FILE)),
        cert_file: Some(dir.join(SERVER_CERT_FILE)),
        key_file: Some(dir.join(SERVER_KEY_FILE)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("weft-launch-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_local_setup_loads_and_keys_are_private() {
        let d = scratch("local");
        let files = ensure_local(&d).unwrap();
        for key in [CA_KEY_FILE, SERVER_KEY_FILE] {
            let mode = std::fs::metadata(d.join(key)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{key}");
        }
        let cfg = weft_fabric::TlsConfig::server_from_files(&files).unwrap();
        assert!(cfg.is_server());
        // A second call keeps what is there.
        let before = std::fs::read(d.join(SERVER_CERT_FILE)).unwrap();
        ensure_local(&d).unwrap();
        assert_eq!(std::fs::read(d.join(SERVER_CERT_FILE)).unwrap(), before);
        assert!(matches!(make_ca(&d), Err(CertError::Exists { .. })));
        let _ = std::fs::remove_dir_all(&d);
    }
}
