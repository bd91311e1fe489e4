//! Client TLS for the OTLP exporters, with the collector's `configtls` client settings
//! (`exporters.otlp.tls`): `insecure`, `insecure_skip_verify`, `ca_file`, `cert_file`, `key_file`,
//! `server_name_override`.
//!
//! One [`rustls::ClientConfig`] is built here and used by both transports (the gRPC channel's
//! connector and the OTLP/HTTP client), so the two verify a server in exactly the same way. The
//! crypto provider is named explicitly (ring) rather than taken from the process default, so the
//! build never depends on which provider some other crate installed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde::Deserialize;

/// `tls:` under an exporter. Absent, TLS follows the endpoint's scheme (`https://` is TLS with the
/// system's trust store); see [`TlsClientSetting::wanted`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsClientSetting {
    /// Plaintext for an endpoint written without a scheme (the collector's meaning for gRPC). An
    /// `https://` endpoint is TLS whatever this says, as the OTLP exporter specification has the
    /// scheme take precedence.
    #[serde(default)]
    pub insecure: bool,
    /// Accept any server certificate (the handshake's signatures are still checked). For tests
    /// and emergencies only: it gives up knowing who the data goes to.
    #[serde(default)]
    pub insecure_skip_verify: bool,
    /// PEM file of the CA certificates to trust instead of the system's trust store.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for mutual TLS (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// The name the server's certificate must carry, when it is not the endpoint's host (an
    /// endpoint given by IP address, or behind a TCP proxy).
    pub server_name_override: Option<String>,
}

/// Why a TLS client configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsClientError {
    #[error("cannot read {what} {path}: {source}")]
    Read { what: &'static str, path: String, source: rustls::pki_types::pem::Error },
    #[error("{what} {path} holds no PEM {expected}")]
    Empty { what: &'static str, path: String, expected: &'static str },
    #[error("cert_file and key_file must be given together (mutual TLS needs both)")]
    Pair,
    #[error("server_name_override {0:?} is neither a DNS name nor an IP address")]
    ServerName(String),
    #[error("the TLS settings are not usable: {0}")]
    Rustls(#[from] rustls::Error),
}

impl TlsClientSetting {
    /// What is wrong with the settings on their own (before any file is read), for `validate`.
    pub fn check(&self) -> Result<(), TlsClientError> {
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(TlsClientError::Pair);
        }
        if let Some(n) = &self.server_name_override {
            ServerName::try_from(n.as_str()).map_err(|_| TlsClientError::ServerName(n.clone()))?;
        }
        Ok(())
    }

    /// Whether any setting asks for TLS (a file, a name, skipping verification). Such settings
    /// with an `http://` endpoint would be silently unused, so the caller refuses that pair.
    pub fn asks_for_tls(&self) -> bool {
        self.insecure_skip_verify
            || self.ca_file.is_some()
            || self.cert_file.is_some()
            || self.key_file.is_some()
            || self.server_name_override.is_some()
    }

    /// The server name to verify, when overridden.
    pub fn server_name(&self) -> Result<Option<ServerName<'static>>, TlsClientError> {
        match &self.server_name_override {
            None => Ok(None),
            Some(n) => ServerName::try_from(n.clone()).map(Some).map_err(|_| TlsClientError::ServerName(n.clone())),
        }
    }

    /// Build the client configuration: the trust anchors (`ca_file`, else the system's store), the
    /// client certificate if any. Files are read now, so a bad path fails at start, not at the
    /// first export.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsClientError> {
        self.check()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
        let builder = if self.insecure_skip_verify {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyServerCert(provider)))
        } else {
            let mut roots = rustls::RootCertStore::empty();
            match &self.ca_file {
                Some(ca) => {
                    for c in read_certs(ca, "ca_file")? {
                        roots.add(c)?;
                    }
                }
                None => {
                    // The collector uses the system pool; certificates the store cannot parse are
                    // skipped (as Go's does), and an empty store fails at the handshake, named.
                    let found = rustls_native_certs::load_native_certs();
                    for e in &found.errors {
                        tracing::debug!(error = %e, "system trust store: a certificate could not be loaded");
                    }
                    let (added, _) = roots.add_parsable_certificates(found.certs);
                    if added == 0 {
                        tracing::warn!("no CA certificate found in the system trust store; set exporters.otlp.tls.ca_file");
                    }
                }
            }
            builder.with_root_certificates(roots)
        };
        let cfg = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert, "cert_file")?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|source| match source {
                    rustls::pki_types::pem::Error::NoItemsFound => {
                        TlsClientError::Empty { what: "key_file", path: key.display().to_string(), expected: "private key" }
                    }
                    source => TlsClientError::Read { what: "key_file", path: key.display().to_string(), source },
                })?;
                builder.with_client_auth_cert(chain, key)?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err(TlsClientError::Pair),
        };
        Ok(cfg)
    }
}

fn read_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsClientError> {
    let p = path.display().to_string();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsClientError::Read { what, path: p.clone(), source })?;
    if certs.is_empty() {
        return Err(TlsClientError::Empty { what, path: p, expected: "certificate" });
    }
    Ok(certs)
}

/// `insecure_skip_verify`: any certificate is taken, but the handshake signatures are verified,
/// so the connection is at least with whoever holds the key of the certificate presented.
#[derive(Debug)]
struct AnyServerCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked_before_any_file_is_read() {
        let half = TlsClientSetting { cert_file: Some("c.pem".into()), ..Default::default() };
        assert!(matches!(half.check(), Err(TlsClientError::Pair)));
        let bad_name = TlsClientSetting { server_name_override: Some("not a name".into()), ..Default::default() };
        assert!(matches!(bad_name.check(), Err(TlsClientError::ServerName(_))));
        assert!(TlsClientSetting::default().check().is_ok());
        assert!(!TlsClientSetting { insecure: true, ..Default::default() }.asks_for_tls());
        assert!(TlsClientSetting { ca_file: Some("ca.pem".into()), ..Default::default() }.asks_for_tls());
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = TlsClientSetting { ca_file: Some(dir.path().join("nope.pem")), ..Default::default() };
        let e = missing.client_config().unwrap_err().to_string();
        assert!(e.contains("ca_file") && e.contains("nope.pem"), "{e}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no pem here\n").unwrap();
        let e = TlsClientSetting { ca_file: Some(empty), ..Default::default() }.client_config().unwrap_err().to_string();
        assert!(e.contains("ca_file") && e.contains("certificate"), "{e}");
        // Skipping verification needs no file.
        assert!(TlsClientSetting { insecure_skip_verify: true, ..Default::default() }.client_config().is_ok());
    }
}
