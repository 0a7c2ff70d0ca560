//! The webhook's server certificate, read from files and re-read when they change.
//!
//! cert-manager renews a certificate by rewriting its Secret, and the kubelet swaps
//! the mounted files (a symlink flip, so both change at once); a manually managed
//! Secret is updated the same way. [`ReloadingCert`] looks at both files' metadata
//! on every TLS handshake — one `stat` each, no watch to lose across symlink swaps —
//! and loads them again when either changed. A pair that does not load (a half
//! written file, a key that does not match the certificate) keeps the previous
//! certificate in service and is tried again at the next handshake, so the listener
//! never stops serving because of a rotation in progress.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Why the certificate files could not be used. Retryable: the files are read again
/// when they change.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read {path}: {error}")]
    ReadFailed {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{path}: no PEM certificate found")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no usable PEM private key.
    #[error("{path}: no PEM private key found ({reason})")]
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        reason: String,
    },
    /// The key does not belong to the certificate, or its type is not supported.
    #[error("{cert} and {key} do not form a usable pair: {reason}")]
    PairRejected {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        reason: rustls::Error,
    },
    /// The TLS settings could not be built.
    #[error("cannot set up TLS: {0}")]
    SetupFailed(rustls::Error),
}

/// What identifies one version of a file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: meta.ino(),
    })
}

struct State {
    /// The pair in service.
    current: Arc<CertifiedKey>,
    /// The file versions it was loaded from (or last tried).
    stamps: (Option<Stamp>, Option<Stamp>),
}

/// A [`ResolvesServerCert`] serving the certificate in `certFile`/`keyFile`,
/// reloaded when either file changes (see the module docs).
pub struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<State>,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Loads the pair once.
    ///
    /// # Errors
    ///
    /// The files cannot be read, hold no certificate or key, or do not match: the
    /// listener cannot start without a certificate.
    pub fn load(
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, Error> {
        let cert_file = cert_file.into();
        let key_file = key_file.into();
        let stamps = (stamp(&cert_file), stamp(&key_file));
        let current = Arc::new(read_pair(&cert_file, &key_file, &provider)?);
        Ok(Self {
            cert_file,
            key_file,
            provider,
            state: Mutex::new(State { current, stamps }),
        })
    }

    /// The pair to serve now, re-read first when a file changed.
    fn current(&self) -> Arc<CertifiedKey> {
        let stamps = (stamp(&self.cert_file), stamp(&self.key_file));
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if stamps != state.stamps {
            state.stamps = stamps;
            match read_pair(&self.cert_file, &self.key_file, &self.provider) {
                Ok(pair) => {
                    tracing::info!(
                        cert_file = %self.cert_file.display(),
                        "Webhook certificate reloaded"
                    );
                    state.current = Arc::new(pair);
                }
                Err(error) => tracing::warn!(
                    %error,
                    "Webhook certificate files changed but cannot be used; serving the \
                     previous certificate until they change again"
                ),
            }
        }
        state.current.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read_pair(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, Error> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|error| Error::ReadFailed {
            path: path.to_path_buf(),
            error,
        })
    };
    let cert_pem = read(cert)?;
    let key_pem = read(key)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(Error::NoCertificate {
            path: cert.to_path_buf(),
        });
    }
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|error| Error::NoKey {
        path: key.to_path_buf(),
        reason: error.to_string(),
    })?;
    CertifiedKey::from_der(chain, private, provider).map_err(|reason| Error::PairRejected {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        reason,
    })
}

/// The TLS acceptor of the webhook listener: TLS 1.2 and 1.3 with the aws-lc-rs
/// provider, the certificate from [`ReloadingCert`], HTTP/1.1 only (what the API
/// server speaks to webhooks).
///
/// # Errors
///
/// As [`ReloadingCert::load`].
pub fn acceptor(cert_file: &Path, key_file: &Path) -> Result<tokio_rustls::TlsAcceptor, Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let resolver = ReloadingCert::load(cert_file, key_file, provider.clone())?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(Error::SetupFailed)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
