//! How an `https://` upstream is verified: the rustls client settings of the HTTP tap's upstream
//! client and of the verifiers' `http` checks. Below both (`http` and `verify` import it, not each
//! other), beside the TLS helpers they share in `config::tls`.

use std::sync::Arc;

/// Verification of an `https://` upstream.
#[derive(Clone, Debug, Default)]
pub(crate) struct UpstreamTls {
    /// Trust only the CAs in this PEM file (else the system's roots).
    pub ca_file: Option<String>,
    /// Accept any certificate (the handshake is still TLS; nothing is authenticated).
    pub insecure_skip_verify: bool,
}

impl UpstreamTls {
    /// The rustls client configuration (HTTP/1.1 only, as the tap's client).
    pub(crate) fn client_config(&self) -> Result<rustls::ClientConfig, String> {
        let provider = crate::config::tls::provider();
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let cfg = if self.insecure_skip_verify {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))).with_no_client_auth()
        } else {
            let roots = match &self.ca_file {
                Some(path) => crate::config::tls::read_roots("upstream_ca_file", path).map_err(|e| format!("--upstream-ca-file: {e}"))?,
                None => {
                    let found = rustls_native_certs::load_native_certs();
                    let mut roots = rustls::RootCertStore::empty();
                    let (added, _) = roots.add_parsable_certificates(found.certs);
                    if added == 0 {
                        return Err(format!("no system CA certificates found ({} errors); give --upstream-ca-file", found.errors.len()));
                    }
                    roots
                }
            };
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        // No ALPN here: hyper-rustls sets it (`enable_http1`) and refuses a preset one.
        Ok(cfg)
    }
}

/// `--upstream-insecure-skip-verify`: any certificate is accepted; the handshake signatures are
/// still checked, so the connection is TLS, only unauthenticated.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
