//! Test parts for the exporter tests (issue 10): test certificates made with rcgen, an OTLP/gRPC
//! sink and an OTLP/HTTP sink that record how each request came (`grpc-encoding`,
//! `Content-Encoding`, `Content-Type`, path), decode it, and can listen with TLS (mutual TLS too).
//! The HTTP sink answers from a script (`503` with `Retry-After`, `400`...), then 200.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::Read as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use opentelemetry_proto::tonic::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{MetricsService, MetricsServiceServer};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use prost::Message;
use tokio::sync::oneshot;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

// ---------------------------------------------------------------------------------------------
// Certificates
// ---------------------------------------------------------------------------------------------

/// A CA, a server certificate for 127.0.0.1 and `sink.test` (not `localhost`) signed by it, a client certificate
/// signed by it, and a second, unrelated CA (the "wrong CA"), as PEM files in a temporary folder.
pub struct Certs {
    _dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Certs {
    pub fn generate() -> Certs {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let dir = tempfile::tempdir().unwrap();
        let ca_params = |name: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, name);
            p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
            p
        };
        let ca = CertifiedIssuer::self_signed(ca_params("mcp-health test CA"), KeyPair::generate().unwrap()).unwrap();
        let other = CertifiedIssuer::self_signed(ca_params("some other CA"), KeyPair::generate().unwrap()).unwrap();
        let leaf = |names: Vec<String>, client: bool| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(names).unwrap();
            p.distinguished_name.push(DnType::CommonName, if client { "mcp-health exporter" } else { "sink" });
            p.extended_key_usages =
                vec![if client { rcgen::ExtendedKeyUsagePurpose::ClientAuth } else { rcgen::ExtendedKeyUsagePurpose::ServerAuth }];
            let cert = p.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "sink.test".into()], false);
        let (client_cert, client_key) = leaf(vec!["client.test".into()], true);
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        Certs {
            ca: write("ca.pem", &ca.pem()),
            other_ca: write("other-ca.pem", &other.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server-key.pem", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client-key.pem", &client_key),
            _dir: dir,
        }
    }

    /// A rustls server configuration with the server certificate; with `client_auth`, clients
    /// must present a certificate signed by the CA.
    pub fn server_config(&self, client_auth: bool, alpn: &[&[u8]]) -> rustls::ServerConfig {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.server_cert).unwrap().map(|c| c.unwrap()).collect();
        let key = PrivateKeyDer::from_pem_file(&self.server_key).unwrap();
        let b = rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().unwrap();
        let b = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(&self.ca).unwrap() {
                roots.add(c.unwrap()).unwrap();
            }
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().unwrap();
            b.with_client_cert_verifier(v)
        } else {
            b.with_no_client_auth()
        };
        let mut cfg = b.with_single_cert(chain, key).unwrap();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        cfg
    }
}

// ---------------------------------------------------------------------------------------------
// What a sink saw
// ---------------------------------------------------------------------------------------------

/// One request as it arrived.
#[derive(Clone, Debug, Default)]
pub struct Arrival {
    /// `/v1/traces`... or the gRPC method path.
    pub path: String,
    /// `Content-Encoding` (HTTP) or `grpc-encoding` (gRPC); empty when none.
    pub encoding: String,
    pub content_type: String,
    pub headers: Vec<(String, String)>,
    /// Whether the connection was TLS.
    pub tls: bool,
    /// The status answered (HTTP).
    pub status: u16,
}

#[derive(Default)]
pub struct Seen {
    pub arrivals: Mutex<Vec<Arrival>>,
    pub traces: Mutex<Vec<ExportTraceServiceRequest>>,
    pub metrics: Mutex<Vec<ExportMetricsServiceRequest>>,
    pub logs: Mutex<Vec<ExportLogsServiceRequest>>,
    /// Trace requests answered with a scripted (non-200) status, decoded (HTTP sink).
    pub refused: Mutex<Vec<ExportTraceServiceRequest>>,
    /// TLS handshakes that failed (HTTP sink).
    pub handshake_failures: Mutex<Vec<String>>,
}

impl Seen {
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.lock().unwrap().clone()
    }
    /// Spans carrying a verdict (health spans).
    pub fn health_spans(&self) -> usize {
        self.traces
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .filter(|s| s.attributes.iter().any(|a| a.key == "mcp_health.verdict.state"))
            .count()
    }
    pub fn metric_names(&self) -> Vec<String> {
        self.metrics
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| &r.resource_metrics)
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .map(|m| m.name.clone())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// OTLP/gRPC sink
// ---------------------------------------------------------------------------------------------

#[derive(Clone)]
struct GrpcSvc(Arc<Seen>, bool);

impl GrpcSvc {
    fn note<T>(&self, r: &Request<T>, path: &str) {
        let md = r.metadata();
        let get = |k: &str| md.get(k).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        self.0.arrivals.lock().unwrap().push(Arrival {
            path: path.into(),
            encoding: get("grpc-encoding"),
            content_type: get("content-type"),
            headers: md
                .iter()
                .filter_map(|kv| match kv {
                    tonic::metadata::KeyAndValueRef::Ascii(k, v) => Some((k.to_string(), v.to_str().unwrap_or("").to_string())),
                    _ => None,
                })
                .collect(),
            tls: self.1,
            status: 200,
        });
    }
}

#[tonic::async_trait]
impl TraceService for GrpcSvc {
    async fn export(&self, r: Request<ExportTraceServiceRequest>) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.note(&r, "traces");
        self.0.traces.lock().unwrap().push(r.into_inner());
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for GrpcSvc {
    async fn export(&self, r: Request<ExportMetricsServiceRequest>) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        self.note(&r, "metrics");
        self.0.metrics.lock().unwrap().push(r.into_inner());
        Ok(Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl LogsService for GrpcSvc {
    async fn export(&self, r: Request<ExportLogsServiceRequest>) -> Result<Response<ExportLogsServiceResponse>, Status> {
        self.note(&r, "logs");
        self.0.logs.lock().unwrap().push(r.into_inner());
        Ok(Response::new(ExportLogsServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver taking gzip and zstd, optionally over TLS (`client_auth`: mutual TLS).
pub struct GrpcSink {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    tls: bool,
    _stop: oneshot::Sender<()>,
}

impl GrpcSink {
    pub async fn start(tls: Option<(&Certs, bool)>) -> GrpcSink {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let svc = GrpcSvc(seen.clone(), tls.is_some());
        let mut server = tonic::transport::Server::builder();
        if let Some((certs, client_auth)) = tls {
            let id =
                tonic::transport::Identity::from_pem(std::fs::read(&certs.server_cert).unwrap(), std::fs::read(&certs.server_key).unwrap());
            let mut t = tonic::transport::ServerTlsConfig::new().identity(id);
            if client_auth {
                t = t.client_ca_root(tonic::transport::Certificate::from_pem(std::fs::read(&certs.ca).unwrap()));
            }
            server = server.tls_config(t).unwrap();
        }
        let (stop, stopped) = oneshot::channel::<()>();
        let r = server
            .add_service(
                TraceServiceServer::new(svc.clone())
                    .accept_compressed(CompressionEncoding::Gzip)
                    .accept_compressed(CompressionEncoding::Zstd),
            )
            .add_service(
                MetricsServiceServer::new(svc.clone())
                    .accept_compressed(CompressionEncoding::Gzip)
                    .accept_compressed(CompressionEncoding::Zstd),
            )
            .add_service(
                LogsServiceServer::new(svc).accept_compressed(CompressionEncoding::Gzip).accept_compressed(CompressionEncoding::Zstd),
            )
            .serve_with_incoming_shutdown(tonic::transport::server::TcpIncoming::from(listener), async {
                let _ = stopped.await;
            });
        tokio::spawn(async move {
            if let Err(e) = r.await {
                eprintln!("gRPC sink failed: {e}");
            }
        });
        GrpcSink { addr, seen, tls: tls.is_some(), _stop: stop }
    }

    pub fn endpoint(&self) -> String {
        format!("{}://{}", if self.tls { "https" } else { "http" }, self.addr)
    }
}

// ---------------------------------------------------------------------------------------------
// OTLP/HTTP sink
// ---------------------------------------------------------------------------------------------

/// An answer the HTTP sink gives: status and `Retry-After`.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<&'static str>,
}

/// An OTLP/HTTP receiver (`/v1/traces`, `/v1/metrics`, `/v1/logs`; protobuf or JSON; gzip or zstd
/// bodies), optionally over TLS. It answers trace requests with the scripted answers first, in
/// order, then 200.
pub struct HttpSink {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
    script: Arc<Mutex<VecDeque<Answer>>>,
    tls: bool,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HttpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HttpSink {
    pub async fn start(tls: Option<(&Certs, bool)>, script: Vec<Answer>) -> HttpSink {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let acceptor = tls.map(|(c, client_auth)| tokio_rustls::TlsAcceptor::from(Arc::new(c.server_config(client_auth, &[b"http/1.1"]))));
        let (s2, sc2) = (seen.clone(), script.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let (seen, script, acceptor) = (s2.clone(), sc2.clone(), acceptor.clone());
                tokio::spawn(async move {
                    match acceptor {
                        Some(a) => match a.accept(tcp).await {
                            Ok(io) => serve_http(hyper_util::rt::TokioIo::new(io), seen, script, true).await,
                            Err(e) => seen.handshake_failures.lock().unwrap().push(e.to_string()),
                        },
                        None => serve_http(hyper_util::rt::TokioIo::new(tcp), seen, script, false).await,
                    }
                });
            }
        });
        HttpSink { addr, seen, script, tls: tls.is_some(), task }
    }

    /// The base URL (`http[s]://127.0.0.1:PORT`); the exporter appends `/v1/<signal>`.
    pub fn endpoint(&self) -> String {
        format!("{}://{}", if self.tls { "https" } else { "http" }, self.addr)
    }
}

async fn serve_http<I>(io: I, seen: Arc<Seen>, script: Arc<Mutex<VecDeque<Answer>>>, tls: bool)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let (seen, script) = (seen.clone(), script.clone());
        async move {
            let path = req.uri().path().to_string();
            let header = |k: &str| req.headers().get(k).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            let mut a = Arrival {
                path: path.clone(),
                encoding: header("content-encoding"),
                content_type: header("content-type"),
                headers: req.headers().iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string())).collect(),
                tls,
                status: 200,
            };
            let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
            let raw = match a.encoding.as_str() {
                "gzip" => {
                    let mut out = Vec::new();
                    flate2::read::MultiGzDecoder::new(&body[..]).read_to_end(&mut out).map(|_| out).ok()
                }
                "zstd" => zstd::decode_all(&body[..]).ok(),
                "" => Some(body.to_vec()),
                _ => None,
            };
            let json = a.content_type.starts_with("application/json");
            let answer = if path == "/v1/traces" { script.lock().unwrap().pop_front() } else { None };
            if let Some(ans) = answer {
                a.status = ans.status;
                if let Some(r) = raw.as_deref().and_then(|raw| decode::<ExportTraceServiceRequest>(raw, json)) {
                    seen.refused.lock().unwrap().push(r);
                }
                seen.arrivals.lock().unwrap().push(a);
                let mut r = hyper::Response::builder().status(ans.status);
                if let Some(ra) = ans.retry_after {
                    r = r.header("retry-after", ra);
                }
                return Ok::<_, std::convert::Infallible>(r.body(Full::new(Bytes::new())).unwrap());
            }
            let ok = match (raw, path.as_str()) {
                (Some(raw), "/v1/traces") => decode::<ExportTraceServiceRequest>(&raw, json).map(|r| seen.traces.lock().unwrap().push(r)),
                (Some(raw), "/v1/metrics") => {
                    decode::<ExportMetricsServiceRequest>(&raw, json).map(|r| seen.metrics.lock().unwrap().push(r))
                }
                (Some(raw), "/v1/logs") => decode::<ExportLogsServiceRequest>(&raw, json).map(|r| seen.logs.lock().unwrap().push(r)),
                _ => None,
            };
            a.status = if ok.is_some() { 200 } else { 400 };
            let status = a.status;
            seen.arrivals.lock().unwrap().push(a);
            let body = if status == 200 { ExportTraceServiceResponse::default().encode_to_vec() } else { Vec::new() };
            Ok(hyper::Response::builder()
                .status(status)
                .header("content-type", "application/x-protobuf")
                .body(Full::new(Bytes::from(body)))
                .unwrap())
        }
    });
    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
}

fn decode<T: Message + Default + serde::de::DeserializeOwned>(raw: &[u8], json: bool) -> Option<T> {
    if json {
        serde_json::from_slice(raw).ok()
    } else {
        T::decode(raw).ok()
    }
}
