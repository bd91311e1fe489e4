//! Test certificates, generated per test with rcgen (nothing is checked in): a CA, a server
//! certificate for `localhost` and `127.0.0.1` signed by it, a client certificate signed by it,
//! and a client certificate signed by another CA (for "a certificate the server does not trust").
//! Also a TLS HTTP/1.1 client (hyper-util + hyper-rustls) that trusts the CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// PEM files in a temporary directory.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// Signed by a CA the server does not know.
    pub stranger_cert: PathBuf,
    pub stranger_key: PathBuf,
    /// The CA, to sign a renewed server certificate ([`Pki::renew_server`]).
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().expect("CA key");
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let cert = p.self_signed(&key).expect("CA certificate");
    (cert.pem(), Issuer::new(p, key))
}

fn leaf(issuer: &Issuer<'_, KeyPair>, names: &[&str], usage: ExtendedKeyUsagePurpose) -> (String, String) {
    let key = KeyPair::generate().expect("leaf key");
    let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("leaf params");
    p.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("client"));
    p.extended_key_usages = vec![usage];
    let cert = p.signed_by(&key, issuer).expect("leaf certificate");
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    pub fn generate() -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, pem: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, pem).expect("write PEM");
            p
        };
        let (ca_pem, issuer) = ca("mcp-health test CA");
        let (server_cert, server_key) = leaf(&issuer, &["localhost", "127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) = leaf(&issuer, &["e2e-client"], ExtendedKeyUsagePurpose::ClientAuth);
        let (_, other) = ca("another CA");
        let (stranger_cert, stranger_key) = leaf(&other, &["stranger"], ExtendedKeyUsagePurpose::ClientAuth);
        Pki {
            ca: write("ca.pem", &ca_pem),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            stranger_cert: write("stranger.pem", &stranger_cert),
            stranger_key: write("stranger.key", &stranger_key),
            issuer,
            dir,
        }
    }

    /// A new server certificate and key (same names, same CA, valid until `not_after` as
    /// (year, month, day) at 00:00 UTC), written in place of `server_cert` and `server_key` as a
    /// renewal does (each file replaced by a rename); the certificate's DER.
    pub fn renew_server(&self, not_after: (i32, u8, u8)) -> Vec<u8> {
        let key = KeyPair::generate().expect("leaf key");
        let mut p = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).expect("leaf params");
        p.distinguished_name.push(DnType::CommonName, "localhost");
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let cert = p.signed_by(&key, &self.issuer).expect("leaf certificate");
        replace(&self.server_key, key.serialize_pem().as_bytes());
        replace(&self.server_cert, cert.pem().as_bytes());
        cert.der().to_vec()
    }

    /// `tls:` lines for a listener (server certificate; `client_ca_file` when `mutual`).
    pub fn server_tls_yaml(&self, mutual: bool) -> String {
        let mut y = format!("tls:\n  cert_file: {}\n  key_file: {}\n", q(&self.server_cert), q(&self.server_key));
        if mutual {
            y.push_str(&format!("  client_ca_file: {}\n", q(&self.ca)));
        }
        y
    }
}

/// Write `bytes` to `path` by a rename, so that no reader sees half a file.
pub fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).expect("write PEM");
    std::fs::rename(&tmp, path).expect("rename PEM");
}

fn q(p: &Path) -> String {
    serde_json::to_string(p).unwrap()
}

/// A rustls client configuration trusting `ca`, with a client certificate when given.
pub fn client_config(ca: &Path, client: Option<(&Path, &Path)>) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    match client {
        Some((cert, key)) => {
            let chain: Vec<_> = CertificateDer::pem_file_iter(cert).unwrap().map(|c| c.unwrap()).collect();
            b.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(key).unwrap()).unwrap()
        }
        None => b.with_no_client_auth(),
    }
}

/// POST `body` to `url` (`https://…`) over TLS with `cfg`; (status, body) or the error's text.
pub async fn https_post(cfg: rustls::ClientConfig, url: &str, content_type: &str, body: Vec<u8>) -> Result<(u16, Vec<u8>), String> {
    let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(cfg).https_only().enable_http1().build();
    let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
    let req = hyper::Request::post(url).header("content-type", content_type).body(Full::new(Bytes::from(body))).unwrap();
    let resp = client.request(req).await.map_err(|e| {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(x) = src {
            s.push_str(&format!(": {x}"));
            src = x.source();
        }
        s
    })?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes().to_vec();
    Ok((status, body))
}
