//! TLS 1.3 for the `tcp` fabric (rustls with the `ring` provider): the configuration loaded from PEM files and
//! the client and server handshakes. A [`TcpFabric`](crate::TcpFabric) with a [`TlsConfig`] runs every
//! connection under TLS; one without speaks plain TCP. TLS is a layer of the tcp fabric rather than a fabric of its
//! own so that every place that speaks tcp (the client's `AnyFabric`, the data server's heartbeat, the MDS's
//! garbage collector) gets it from one setting, and addresses keep their form (`host:port`).
//!
//! Servers present a certificate chain and key from files; everyone verifies the peer's chain against the
//! cluster's CA file, clients also check the server's name or IP address against the certificate. Clients present
//! no certificate: they prove the cluster key inside the stream (weft-rpc's handshake).

use std::fs;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::ring::default_provider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Why TLS could not be set up from its files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("reading {what} {path}: {source}")]
    Read { what: &'static str, path: PathBuf, source: io::Error },
    #[error("{what} {path} holds no PEM {expect}")]
    Empty { what: &'static str, path: PathBuf, expect: &'static str },
    #[error("{what} {path} is not valid PEM: {reason}")]
    Pem { what: &'static str, path: PathBuf, reason: String },
    #[error("setting up TLS: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("tls = true needs {0}")]
    Missing(&'static str),
}

/// The files of one process's TLS setup (the `tls_*` fields of every role's config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster's CA certificate(s), PEM: peers' chains must lead to one of them.
    pub ca_file: Option<PathBuf>,
    /// This server's certificate chain, PEM, leaf first (servers only).
    pub cert_file: Option<PathBuf>,
    /// This server's private key, PEM (PKCS#8, SEC1 or PKCS#1; servers only).
    pub key_file: Option<PathBuf>,
}

/// A process's TLS configuration: how it verifies servers, and, for a server, what it presents.
#[derive(Clone)]
pub struct TlsConfig {
    client: Arc<ClientConfig>,
    server: Option<Arc<ServerConfig>>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig").field("server", &self.server.is_some()).finish()
    }
}

fn read_pem(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|source| TlsError::Read { what, path: path.to_path_buf(), source })
}

fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_pem(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>().map_err(|e| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if certs.is_empty() {
        return Err(TlsError::Empty { what, path: path.to_path_buf(), expect: "CERTIFICATE" });
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let what = "TLS key file";
    let pem = read_pem(what, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            TlsError::Empty { what, path: path.to_path_buf(), expect: "PRIVATE KEY" }
        }
        e => TlsError::Pem { what, path: path.to_path_buf(), reason: e.to_string() },
    })
}

impl TlsConfig {
    /// Loads the CA and, when both are given, this server's certificate and key. TLS 1.3 only.
    pub fn from_files(files: &TlsFiles) -> Result<TlsConfig, TlsError> {
        let ca_file = files.ca_file.as_deref().ok_or(TlsError::Missing("tls_ca_file"))?;
        let mut roots = RootCertStore::empty();
        for cert in load_certs("TLS CA file", ca_file)? {
            roots.add(cert)?;
        }
        // AES-128-GCM first (then AES-256-GCM, ChaCha20): with AES-NI it is the cheapest TLS 1.3 suite, and
        // encryption is the one per-byte cost TLS adds to the data path.
        let mut provider = default_provider();
        provider.cipher_suites.sort_by_key(|s| match s.suite() {
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
            _ => 2,
        });
        let provider = Arc::new(provider);
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server = match (&files.cert_file, &files.key_file) {
            (Some(cert), Some(key)) => {
                let chain = load_certs("TLS certificate file", cert)?;
                let key = load_key(key)?;
                let cfg = ServerConfig::builder_with_provider(provider)
                    .with_protocol_versions(&[&rustls::version::TLS13])?
                    .with_no_client_auth()
                    .with_single_cert(chain, key)?;
                Some(Arc::new(cfg))
            }
            (None, None) => None,
            (Some(_), None) => return Err(TlsError::Missing("tls_key_file (tls_cert_file is set)")),
            (None, Some(_)) => return Err(TlsError::Missing("tls_cert_file (tls_key_file is set)")),
        };
        Ok(TlsConfig { client: Arc::new(client), server })
    }

    /// Like [`TlsConfig::from_files`], for a server: the certificate and key are required.
    pub fn server_from_files(files: &TlsFiles) -> Result<TlsConfig, TlsError> {
        if files.cert_file.is_none() {
            return Err(TlsError::Missing("tls_cert_file"));
        }
        if files.key_file.is_none() {
            return Err(TlsError::Missing("tls_key_file"));
        }
        TlsConfig::from_files(files)
    }

    /// Whether this configuration can accept connections (it has a certificate and key).
    pub fn is_server(&self) -> bool {
        self.server.is_some()
    }

    pub(crate) fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.client.clone())
    }

    pub(crate) fn acceptor(&self) -> io::Result<tokio_rustls::TlsAcceptor> {
        match &self.server {
            Some(s) => Ok(tokio_rustls::TlsAcceptor::from(s.clone())),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "tls is on but this process has no certificate (tls_cert_file, tls_key_file) to listen with",
            )),
        }
    }
}

/// A server role's TLS (`tls = true` in its config): the certificate and key it listens with, and the CA it
/// verifies the servers it calls with. `None` when `tls` is off.
pub fn server_tls(tls: bool, files: &TlsFiles) -> Result<Option<TlsConfig>, TlsError> {
    if !tls {
        return Ok(None);
    }
    TlsConfig::server_from_files(files).map(Some)
}

/// The name a client checks the server's certificate against: the host part of `host:port` (an IP address is
/// checked as one; `[v6]:port` loses its brackets).
pub(crate) fn server_name(addr: &str) -> io::Result<ServerName<'static>> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host} is not a TLS server name: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_from_addresses() {
        assert_eq!(
            server_name("127.0.0.1:7000").unwrap(),
            ServerName::IpAddress("127.0.0.1".parse::<IpAddr>().unwrap().into())
        );
        assert_eq!(server_name("[::1]:7000").unwrap(), ServerName::IpAddress("::1".parse::<IpAddr>().unwrap().into()));
        assert_eq!(server_name("node-1.example:7000").unwrap(), ServerName::try_from("node-1.example").unwrap());
        assert!(server_name("bad name:1").is_err());
    }

    #[test]
    fn missing_files_are_named() {
        let err = TlsConfig::from_files(&TlsFiles::default()).unwrap_err();
        assert!(err.to_string().contains("tls_ca_file"), "{err}");
        let files = TlsFiles { ca_file: Some("/nonexistent/ca.pem".into()), ..TlsFiles::default() };
        let err = TlsConfig::from_files(&files).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
        let err = TlsConfig::server_from_files(&files).unwrap_err();
        assert!(err.to_string().contains("tls_cert_file"), "{err}");
    }
}
