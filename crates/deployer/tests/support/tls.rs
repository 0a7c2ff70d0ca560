//! TLS helpers for tests that look at the certificate HAProxy presents: self-signed
//! certificates made with `openssl`, the DER of a PEM, and a client that accepts any
//! server certificate so the test can compare it with the one it expects.
//!
//! Self-contained (std, `rustls`, `base64`): the benchmark suite includes this file
//! too, with `#[path]`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// A self-signed certificate and key for `cn`, as one PEM (the key and certificate
/// files are left in `dir`).
pub fn certificate(dir: &Path, cn: &str) -> String {
    let key = dir.join(format!("{cn}.key"));
    let crt = dir.join(format!("{cn}.crt"));
    let status = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .arg("-subj")
        .arg(format!("/CN={cn}"))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .stderr(Stdio::null())
        .status()
        .expect("openssl runs");
    assert!(status.success());
    std::fs::read_to_string(crt).unwrap() + &std::fs::read_to_string(key).unwrap()
}

/// The DER of the first certificate of a PEM bundle.
pub fn der(pem: &str) -> Vec<u8> {
    let body: String = pem
        .split("-----BEGIN CERTIFICATE-----")
        .nth(1)
        .and_then(|rest| rest.split("-----END CERTIFICATE-----").next())
        .expect("a certificate")
        .split_whitespace()
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap()
}

/// A TLS client config that accepts any server certificate (signatures are still
/// checked), for tests that compare the certificate with what they expect.
pub fn any_certificate_client() -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth()
}

/// Accepts any server certificate: the tests compare it with what they expect.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
