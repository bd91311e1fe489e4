//! Issue 37: a TLS certificate renewed in place (cert-manager writes the same paths) is served
//! without a restart: after a SIGHUP, or on `tls.reload_interval` with no signal at all. A real
//! rustls client (tokio-rustls) connects to each TLS listener and compares the certificate it is
//! shown with the one written; a certificate that cannot be used keeps the served one, and the
//! failure is logged and counted; `mcp_health_tls_certificate_expiry_timestamp_seconds` follows
//! the served certificate's not-after. Certificates are made in each test (rcgen), on loopback.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use support::pki::{self, Pki};
use support::*;

/// 2031-05-17T00:00:00Z and 2032-02-29T00:00:00Z, in Unix seconds: the not-after of the first
/// and of the renewed certificate.
const FIRST: (i32, u8, u8) = (2031, 5, 17);
const FIRST_UNIX: f64 = 1_936_742_400.0;
const RENEWED: (i32, u8, u8) = (2032, 2, 29);
const RENEWED_UNIX: f64 = 1_961_625_600.0;

const EXPIRY: &str = "mcp_health_tls_certificate_expiry_timestamp_seconds";
const RELOADS: &str = "mcp_health_tls_reloads_total";

/// The DER of the certificate a TLS handshake with `addr` is shown (the client trusts `ca` and
/// asks for `localhost`), or why the handshake failed.
async fn served_certificate(addr: SocketAddr, ca: &Path) -> Result<Vec<u8>, String> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(pki::client_config(ca, None)));
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| format!("handshake: {e}"))?;
    let (_, conn) = tls.get_ref();
    conn.peer_certificates().and_then(|c| c.first()).map(|c| c.to_vec()).ok_or_else(|| "no certificate".into())
}

/// Until every address in `addrs` shows the certificate `der`.
async fn wait_served(addrs: &[(&str, SocketAddr)], ca: &Path, der: &[u8], what: &str) {
    eventually_async(Duration::from_secs(30), what, || async {
        for (_, addr) in addrs {
            if served_certificate(*addr, ca).await.ok()? != der {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// The value of `name` whose labels include every one of `labels` (`None`: no such series).
fn series(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
}

fn signal_hup(svc: &Service) {
    // SAFETY: kill(2) on the pid of our running, unreaped child.
    let rc = unsafe { libc::kill(svc.pid() as libc::pid_t, libc::SIGHUP) };
    assert_eq!(rc, 0, "kill(SIGHUP)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_renewed_in_place_is_served_after_sighup_and_one_that_cannot_be_used_is_not() {
    let pki = Pki::generate();
    let first = pki.renew_server(FIRST);
    let tls = pki.server_tls_yaml(false);
    let cfg = Cfg { gate: true, listener_extra: vec![("grpc", tls.clone()), ("http", tls.clone()), ("gate", tls)], ..Cfg::default() };
    let svc = Service::start(cfg).await;
    let listeners = [("otlp_grpc", svc.grpc_addr()), ("otlp_http", svc.http_addr()), ("gate", svc.gate_addr())];
    wait_served(&listeners, &pki.ca, &first, "the first certificate on every TLS listener").await;
    let text = svc.metrics_text().await;
    for (name, _) in listeners {
        assert_eq!(series(&text, EXPIRY, &[("listener", name)]), Some(FIRST_UNIX), "{name}:\n{text}");
    }
    assert_eq!(series(&text, EXPIRY, &[("listener", "prometheus")]), None, "a plaintext listener has no certificate");
    let log = svc.stderr();
    assert!(log.contains("TLS certificate served") && log.contains("CN=localhost") && log.contains("2031-05-17T00:00:00Z"), "{log}");

    // Renewed in place, then SIGHUP: every listener serves the new certificate, and none was
    // replaced (the settings did not change).
    let renewed = pki.renew_server(RENEWED);
    signal_hup(&svc);
    wait_served(&listeners, &pki.ca, &renewed, "the renewed certificate on every TLS listener after SIGHUP").await;
    let text = svc.wait_metric(RELOADS, Duration::from_secs(20), |v| v >= 3.0).await;
    for (name, _) in listeners {
        assert_eq!(series(&text, EXPIRY, &[("listener", name)]), Some(RENEWED_UNIX), "{name}:\n{text}");
        assert_eq!(series(&text, RELOADS, &[("listener", name), ("result", "ok")]), Some(1.0), "{name}:\n{text}");
        assert_eq!(series(&text, RELOADS, &[("listener", name), ("result", "failed")]), None, "{name}:\n{text}");
    }
    let log = eventually(Duration::from_secs(20), "the SIGHUP to be applied", || {
        let log = svc.stderr();
        log.contains("new configuration is applied").then_some(log)
    })
    .await;
    assert!(log.contains("TLS certificate reloaded") && log.contains("2032-02-29T00:00:00Z"), "{log}");
    assert_eq!(log.matches("OTLP/gRPC receiver listening").count(), 1, "the listener was not replaced:\n{log}");

    // A key that does not match the certificate (half a renewal), then SIGHUP: the renewed
    // certificate stays served, and the failure is logged and counted for every listener.
    pki::replace(&pki.server_key, std::fs::read(&pki.client_key).unwrap().as_slice());
    signal_hup(&svc);
    let text = svc.wait_metric(RELOADS, Duration::from_secs(20), |v| v >= 6.0).await;
    for (name, _) in listeners {
        assert_eq!(series(&text, RELOADS, &[("listener", name), ("result", "failed")]), Some(1.0), "{name}:\n{text}");
        assert_eq!(series(&text, EXPIRY, &[("listener", name)]), Some(RENEWED_UNIX), "{name}:\n{text}");
    }
    wait_served(&listeners, &pki.ca, &renewed, "the renewed certificate kept after a bad key").await;
    let log = svc.stderr();
    assert!(log.contains("TLS certificate reload failed; the served certificate is kept"), "{log}");
    assert!(log.contains("receivers.otlp.protocols.grpc.tls.key_file"), "the error names the key:\n{log}");
    // Not a certificate at all: the same.
    pki::replace(&pki.server_cert, b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n");
    signal_hup(&svc);
    svc.wait_metric(RELOADS, Duration::from_secs(20), |v| v >= 9.0).await;
    wait_served(&listeners, &pki.ca, &renewed, "the renewed certificate kept after a bad certificate").await;
    assert_eq!(svc.health_status().await, Some(200), "{}", svc.stderr());
    // The listener is the only label: no file path reaches the metrics.
    let text = svc.metrics_text().await;
    let dir = pki.dir.path().display().to_string();
    assert!(!text.contains(&dir) && !text.contains("server.pem"), "a certificate path in /metrics:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_interval_serves_a_renewed_certificate_without_a_signal() {
    let pki = Pki::generate();
    let first = pki.renew_server(FIRST);
    let mut tls = pki.server_tls_yaml(false);
    tls.push_str("  reload_interval: 1s\n");
    let svc = Service::start(Cfg { listener_extra: vec![("grpc", tls)], ..Cfg::default() }).await;
    let grpc = [("otlp_grpc", svc.grpc_addr())];
    wait_served(&grpc, &pki.ca, &first, "the first certificate").await;
    assert_eq!(series(&svc.metrics_text().await, EXPIRY, &[("listener", "otlp_grpc")]), Some(FIRST_UNIX));

    let renewed = pki.renew_server(RENEWED);
    wait_served(&grpc, &pki.ca, &renewed, "the renewed certificate within a few reload intervals").await;
    svc.wait_metric(EXPIRY, Duration::from_secs(20), |v| v == RENEWED_UNIX).await;
    let log = svc.stderr();
    assert!(log.contains("reload_interval") && log.contains("2032-02-29T00:00:00Z"), "{log}");
    assert!(!log.contains("new configuration is applied"), "no SIGHUP was sent:\n{log}");
}
