//! Server-side TLS with the OpenTelemetry Collector's `configtls` server keys (`tls:` under a
//! receiver protocol or the gate): `cert_file` / `cert_pem`, `key_file` / `key_pem`,
//! `client_ca_file` (mutual TLS: a client without a certificate signed by it is refused),
//! `min_version` and `max_version` (`"1.2"` or `"1.3"`; default 1.2 to 1.3, as the collector).
//!
//! `reload_interval` (the collector's key) reads the certificate and key again on a timer.
//!
//! Certificates and keys are read when the configuration is checked (`mcp-health validate`, start,
//! SIGHUP). A listener serves its certificate through a [`ServedCertificate`], which a reload
//! (every SIGHUP, and `reload_interval`) swaps in place: cert-manager and similar tools renew the
//! files at the same path, so comparing the settings as written would never see a renewal, and
//! swapping the certificate (not the listener) keeps every connection and the socket as they are.
//! New handshakes get the new certificate; a certificate or key that cannot be used leaves the
//! served one in place.
//!
//! rustls with the `ring` provider only (the exporters' client TLS uses the same line).

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use serde::Deserialize;

use crate::receive::certificates::{CertificateFacts, LoadError, ServedCertificate};

/// `tls:` of a listener. Absent: the listener is plaintext.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsServerSettings {
    /// PEM file with the server certificate chain (leaf first).
    #[serde(default)]
    pub cert_file: Option<String>,
    /// The same, inline (instead of `cert_file`).
    #[serde(default)]
    pub cert_pem: Option<String>,
    /// PEM file with the private key (PKCS#8, PKCS#1 or SEC1).
    #[serde(default)]
    pub key_file: Option<String>,
    /// The same, inline (instead of `key_file`).
    #[serde(default)]
    pub key_pem: Option<String>,
    /// PEM file of the CAs that sign client certificates; set, every client must present one.
    #[serde(default)]
    pub client_ca_file: Option<String>,
    /// Lowest protocol version accepted: `"1.2"` (default) or `"1.3"`.
    #[serde(default)]
    pub min_version: Option<String>,
    /// Highest protocol version accepted: `"1.2"` or `"1.3"` (default).
    #[serde(default)]
    pub max_version: Option<String>,
    /// Read the certificate and key files again this often (besides every SIGHUP); absent: only
    /// on SIGHUP.
    #[serde(default, with = "humantime_serde")]
    pub reload_interval: Option<Duration>,
}

/// Why a TLS configuration cannot be built. Each names the key it is about ([`TlsError::key`]),
/// and the file when there is one.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { key: &'static str, path: String, source: std::io::Error },
    #[error("{what}: {message}")]
    Pem { key: &'static str, what: String, message: String },
    #[error("{message}")]
    Invalid { key: &'static str, message: String },
    #[error("the certificate ({cert}) and the key ({key_from}) cannot be used: {message}")]
    Unusable { key: &'static str, cert: String, key_from: String, message: String },
}

impl TlsError {
    /// The key under `tls` the error is about (`cert_file`, `key_file`, `client_ca_file`, …).
    pub fn key(&self) -> &'static str {
        match self {
            TlsError::Read { key, .. } | TlsError::Pem { key, .. } | TlsError::Invalid { key, .. } | TlsError::Unusable { key, .. } => key,
        }
    }
}

/// Where a PEM comes from: a file (named in errors) or an inline value.
enum Source<'a> {
    File(&'static str, &'a str),
    Inline(&'static str),
}

impl Source<'_> {
    fn key(&self) -> &'static str {
        match self {
            Source::File(k, _) | Source::Inline(k) => k,
        }
    }
    fn name(&self) -> String {
        match self {
            Source::File(_, p) => (*p).to_string(),
            Source::Inline(k) => format!("inline {k}"),
        }
    }
}

fn pick<'a>(
    file: &'a Option<String>,
    inline: &'a Option<String>,
    fk: &'static str,
    ik: &'static str,
) -> Result<(Source<'a>, Vec<u8>), TlsError> {
    match (file.as_deref().filter(|s| !s.is_empty()), inline.as_deref().filter(|s| !s.is_empty())) {
        (Some(_), Some(_)) => Err(TlsError::Invalid { key: ik, message: format!("give {fk} or {ik}, not both") }),
        (Some(p), None) => {
            let bytes = std::fs::read(p).map_err(|source| TlsError::Read { key: fk, path: p.to_string(), source })?;
            Ok((Source::File(fk, p), bytes))
        }
        (None, Some(pem)) => Ok((Source::Inline(ik), pem.as_bytes().to_vec())),
        (None, None) => Err(TlsError::Invalid { key: fk, message: format!("{fk} (or {ik}) is required when tls is set") }),
    }
}

/// Every certificate in a PEM file; at least one.
pub fn read_certificates(key: &'static str, path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read { key, path: path.to_string(), source })?;
    certificates(&Source::File(key, path), &bytes)
}

fn certificates(src: &Source<'_>, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(bytes).collect();
    let certs = certs.map_err(|e| TlsError::Pem { key: src.key(), what: src.name(), message: format!("not a PEM certificate: {e}") })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            key: src.key(),
            what: src.name(),
            message: "no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into(),
        });
    }
    Ok(certs)
}

/// A root store of the CAs in a PEM file (mutual TLS, the tap's `--upstream-ca-file`).
pub(crate) fn read_roots(key: &'static str, path: &str) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in read_certificates(key, path)? {
        roots.add(c).map_err(|e| TlsError::Pem { key, what: path.to_string(), message: format!("not a usable CA certificate: {e}") })?;
    }
    Ok(roots)
}

/// The crypto provider every TLS configuration of the service is built with.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn version(key: &'static str, v: Option<&str>) -> Result<Option<&'static rustls::SupportedProtocolVersion>, TlsError> {
    match v.map(str::trim) {
        None | Some("") => Ok(None),
        Some("1.2") => Ok(Some(&rustls::version::TLS12)),
        Some("1.3") => Ok(Some(&rustls::version::TLS13)),
        Some("1.0" | "1.1") => Err(TlsError::Invalid { key, message: "TLS 1.0 and 1.1 are not supported; use \"1.2\" or \"1.3\"".into() }),
        Some(other) => Err(TlsError::Invalid { key, message: format!("{other:?} is not a TLS version; use \"1.2\" or \"1.3\"") }),
    }
}

impl TlsServerSettings {
    /// The protocol versions allowed, from `min_version` and `max_version`.
    fn versions(&self) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, TlsError> {
        let min = version("min_version", self.min_version.as_deref())?.unwrap_or(&rustls::version::TLS12);
        let max = version("max_version", self.max_version.as_deref())?.unwrap_or(&rustls::version::TLS13);
        let rank = |v: &rustls::SupportedProtocolVersion| if v.version == rustls::ProtocolVersion::TLSv1_3 { 3 } else { 2 };
        if rank(min) > rank(max) {
            return Err(TlsError::Invalid { key: "max_version", message: "must not be lower than min_version".into() });
        }
        Ok([&rustls::version::TLS13, &rustls::version::TLS12].into_iter().filter(|v| (rank(min)..=rank(max)).contains(&rank(v))).collect())
    }

    /// Read the certificate, key and client CAs and build the rustls server configuration, with
    /// `alpn` as the protocols offered (`h2` for gRPC, `http/1.1` for OTLP/HTTP). The configuration
    /// serves the certificate through the returned [`ServedCertificate`], which a reload swaps.
    pub fn build(&self, alpn: &[&[u8]]) -> Result<(Arc<rustls::ServerConfig>, Arc<ServedCertificate>), TlsError> {
        if self.reload_interval.is_some_and(|d| d.is_zero()) {
            return Err(TlsError::Invalid {
                key: "reload_interval",
                message: "must be greater than zero (leave it out to reload on SIGHUP only)".into(),
            });
        }
        let versions = self.versions()?;
        let (key, facts) = self.certified_key()?;
        let provider = provider();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| TlsError::Invalid { key: "min_version", message: e.to_string() })?;
        let builder = match self.client_ca_file.as_deref().filter(|s| !s.is_empty()) {
            Some(path) => {
                let roots = read_roots("client_ca_file", path)?;
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| TlsError::Pem { key: "client_ca_file", what: path.to_string(), message: e.to_string() })?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        // A reload reads the same files again: the served certificate gets the reading, not the
        // settings, so the listener's side knows nothing of the configuration.
        let settings = self.clone();
        let load = move || settings.certified_key().map_err(|e| LoadError { key: e.key(), message: e.to_string() });
        let served = Arc::new(ServedCertificate::new((key, facts), self.reload_interval, Box::new(load)));
        let mut cfg = builder.with_cert_resolver(served.clone());
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok((Arc::new(cfg), served))
    }

    /// The certificate chain and the key, read and checked to match, with what the log says of
    /// the certificate.
    fn certified_key(&self) -> Result<(Arc<CertifiedKey>, CertificateFacts), TlsError> {
        let (cert_src, cert_bytes) = pick(&self.cert_file, &self.cert_pem, "cert_file", "cert_pem")?;
        let certs = certificates(&cert_src, &cert_bytes)?;
        let facts =
            CertificateFacts::of(&certs[0]).map_err(|message| TlsError::Pem { key: cert_src.key(), what: cert_src.name(), message })?;
        let (key_src, key_bytes) = pick(&self.key_file, &self.key_pem, "key_file", "key_pem")?;
        let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| TlsError::Pem {
            key: key_src.key(),
            what: key_src.name(),
            message: format!("no usable PEM private key (PKCS#8, PKCS#1 or SEC1) in it: {e}"),
        })?;
        let certified = CertifiedKey::from_der(certs, key, &provider()).map_err(|e| TlsError::Unusable {
            key: key_src.key(),
            cert: cert_src.name(),
            key_from: key_src.name(),
            message: e.to_string(),
        })?;
        Ok((Arc::new(certified), facts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_and_conflicts_name_their_key_and_file() {
        let s =
            TlsServerSettings { cert_file: Some("/nonexistent/server.crt".into()), key_file: Some("/x.key".into()), ..Default::default() };
        let e = s.build(&[]).unwrap_err();
        assert_eq!(e.key(), "cert_file");
        assert!(e.to_string().contains("/nonexistent/server.crt"), "{e}");
        let e = TlsServerSettings::default().build(&[]).unwrap_err();
        assert_eq!(e.key(), "cert_file", "{e}");
        let s = TlsServerSettings { cert_file: Some("a".into()), cert_pem: Some("b".into()), ..Default::default() };
        assert_eq!(s.build(&[]).unwrap_err().key(), "cert_pem");
        let s = TlsServerSettings { min_version: Some("1.1".into()), ..Default::default() };
        assert_eq!(s.build(&[]).unwrap_err().key(), "min_version");
        let s = TlsServerSettings { min_version: Some("1.3".into()), max_version: Some("1.2".into()), ..Default::default() };
        assert_eq!(s.build(&[]).unwrap_err().key(), "max_version");
    }

    #[test]
    fn versions_follow_min_and_max() {
        let v = |min: Option<&str>, max: Option<&str>| {
            let s = TlsServerSettings { min_version: min.map(Into::into), max_version: max.map(Into::into), ..Default::default() };
            s.versions().unwrap().iter().map(|v| v.version).collect::<Vec<_>>()
        };
        use rustls::ProtocolVersion::{TLSv1_2, TLSv1_3};
        assert_eq!(v(None, None), vec![TLSv1_3, TLSv1_2]);
        assert_eq!(v(Some("1.3"), None), vec![TLSv1_3]);
        assert_eq!(v(None, Some("1.2")), vec![TLSv1_2]);
    }

    /// A self-signed certificate for `name` and its key, as PEM files in `dir`.
    fn self_signed(dir: &std::path::Path, name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap().self_signed(&key).unwrap();
        let (c, k) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c.display().to_string(), k.display().to_string())
    }

    fn grpc_tls(cert: &str, key: &str, extra: &str) -> String {
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:0\n        tls:\n          cert_file: {cert:?}\n          key_file: {key:?}\n{extra}"
        )
    }

    #[test]
    fn reload_interval_is_a_duration_greater_than_zero() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed(dir.path(), "localhost");
        let env = |_: &str| None;
        let parse = |extra: &str| crate::config::Config::parse("c.yaml", &grpc_tls(&cert, &key, extra), &env);
        let c = parse("          reload_interval: 1h\n").unwrap();
        let tls = c.receivers.otlp.protocols.grpc.unwrap().tls.unwrap();
        assert_eq!(tls.reload_interval, Some(Duration::from_secs(3600)));
        assert_eq!(parse("").unwrap().receivers.otlp.protocols.grpc.unwrap().tls.unwrap().reload_interval, None, "off by default");
        for zero in ["0s", "0ms"] {
            let e = parse(&format!("          reload_interval: {zero}\n")).unwrap_err().to_string();
            assert!(e.contains("receivers.otlp.protocols.grpc.tls.reload_interval") && e.contains("greater than zero"), "{zero}: {e}");
        }
        for not_a_duration in ["hourly", "0", "-1h"] {
            let e = parse(&format!("          reload_interval: {not_a_duration}\n")).unwrap_err().to_string();
            assert!(e.contains("receivers.otlp.protocols.grpc.tls.reload_interval"), "{not_a_duration}: {e}");
        }
        // Named even before the files are read (a missing certificate is another error).
        let s = TlsServerSettings { reload_interval: Some(Duration::ZERO), ..Default::default() };
        assert_eq!(s.build(&[]).unwrap_err().key(), "reload_interval");
    }
}
