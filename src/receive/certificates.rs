//! The certificates the TLS listeners serve, while they serve them: each is logged (subject and
//! not-after) when its listener starts and at every reload, its not-after is published for
//! `mcp_health.tls.certificate_expiry_timestamp`, and every reload is counted in
//! `mcp_health.tls.reloads` by result.
//!
//! A reload comes from SIGHUP ([`CertificateWatch::reload`]) or from the listener's
//! `tls.reload_interval` (a timer the watch owns). A certificate or key that cannot be read or
//! used leaves the served certificate in place; the error log says so and names the key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::task::JoinHandle;

use crate::receive::listen::ListenerName;

/// The longest subject the log carries (a certificate's subject has no length limit of its own).
const MAX_SUBJECT: usize = 256;

/// What the log and the expiry gauge say of a certificate: its subject and its not-after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateFacts {
    /// The subject's distinguished name (RFC 4514 order, `CN=…`), at most [`MAX_SUBJECT`] bytes.
    pub subject: String,
    /// The end of the validity period, in seconds since the Unix epoch.
    pub not_after: i64,
    /// The certificate's DER, hashed: a reload says whether the certificate changed.
    fingerprint: [u8; 32],
}

impl CertificateFacts {
    /// The subject and not-after of the DER certificate `der` (x509-parser reads what
    /// rustls-webpki keeps to itself).
    pub fn of(der: &CertificateDer<'_>) -> Result<CertificateFacts, String> {
        use x509_parser::prelude::FromDer as _;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der.as_ref())
            .map_err(|e| format!("not a readable X.509 certificate: {e}"))?;
        let mut subject = cert.subject().to_string();
        if subject.len() > MAX_SUBJECT {
            let mut end = MAX_SUBJECT;
            while !subject.is_char_boundary(end) {
                end -= 1;
            }
            subject.truncate(end);
            subject.push('…');
        }
        let fingerprint = ring::digest::digest(&ring::digest::SHA256, der.as_ref()).as_ref().try_into().unwrap_or([0; 32]);
        Ok(CertificateFacts { subject, not_after: cert.validity().not_after.timestamp(), fingerprint })
    }

    /// The not-after as RFC 3339 (UTC), as the log shows it.
    pub fn not_after_rfc3339(&self) -> String {
        let at = u64::try_from(self.not_after).map_or(std::time::UNIX_EPOCH, |s| std::time::UNIX_EPOCH + Duration::from_secs(s));
        humantime::format_rfc3339_seconds(at).to_string()
    }
}

/// The certificate a TLS listener serves: rustls asks it at every handshake, and a reload swaps
/// it in place, so a renewed certificate is served without a new listener.
pub struct ServedCertificate {
    /// Reads the certificate and key again (the listener's configuration, as at its start).
    load: Loader,
    reload_interval: Option<Duration>,
    current: RwLock<(Arc<CertifiedKey>, CertificateFacts)>,
}

/// How a [`ServedCertificate`] reads its certificate and key again: given by the configuration,
/// which knows the files, so this side never holds the settings.
pub(crate) type Loader = Box<dyn Fn() -> Result<(Arc<CertifiedKey>, CertificateFacts), LoadError> + Send + Sync>;

/// Why a certificate could not be read again: the key under `tls` it is about
/// (`cert_file`, `key_file`, …) and what went wrong, as the configuration said it.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct LoadError {
    pub key: &'static str,
    pub message: String,
}

impl LoadError {
    /// The key under `tls` the error is about.
    pub fn key(&self) -> &'static str {
        self.key
    }
}

impl std::fmt::Debug for ServedCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedCertificate").field("reload_interval", &self.reload_interval).field("facts", &self.facts()).finish()
    }
}

/// What a successful [`ServedCertificate::reload`] serves now.
#[derive(Clone, Debug)]
pub struct Reloaded {
    pub facts: CertificateFacts,
    /// The certificate read differs from the one served before.
    pub changed: bool,
}

impl ServedCertificate {
    /// Serves `first` (just read by `load`) until a reload swaps it.
    pub fn new(first: (Arc<CertifiedKey>, CertificateFacts), reload_interval: Option<Duration>, load: Loader) -> ServedCertificate {
        ServedCertificate { load, reload_interval, current: RwLock::new(first) }
    }

    /// The subject and not-after of the certificate served now.
    pub fn facts(&self) -> CertificateFacts {
        self.current.read().unwrap_or_else(PoisonError::into_inner).1.clone()
    }

    /// `reload_interval` of the listener's settings.
    pub fn reload_interval(&self) -> Option<Duration> {
        self.reload_interval
    }

    /// Read the certificate and key again; new handshakes get them. On an error the certificate
    /// served so far stays.
    pub fn reload(&self) -> Result<Reloaded, LoadError> {
        let (key, facts) = (self.load)()?;
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let changed = current.1.fingerprint != facts.fingerprint;
        *current = (key, facts.clone());
        Ok(Reloaded { facts, changed })
    }
}

impl ResolvesServerCert for ServedCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(PoisonError::into_inner).0.clone())
    }
}

/// What asked for a reload (the log's `trigger`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    Sighup,
    Interval,
}

impl Trigger {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Trigger::Sighup => "SIGHUP",
            Trigger::Interval => "reload_interval",
        }
    }
}

/// How a reload ended (`mcp_health.tls.reloads{result}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReloadResult {
    Ok,
    Failed,
}

impl ReloadResult {
    pub(crate) const ALL: [ReloadResult; 2] = [ReloadResult::Ok, ReloadResult::Failed];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReloadResult::Ok => "ok",
            ReloadResult::Failed => "failed",
        }
    }
}

const LISTENERS: usize = ListenerName::ALL.len();

/// Process-wide tallies, read by the metrics at each collection (as the listeners' are).
static RELOADS: [[AtomicU64; 2]; LISTENERS] = [const { [const { AtomicU64::new(0) }; 2] }; LISTENERS];

/// The not-after of the certificate each listener serves now, with the address of its
/// [`ServedCertificate`]: a replaced listener's watch, dropped after its successor started,
/// unpublishes only what it published itself.
static SERVED: Mutex<[Option<(usize, i64)>; LISTENERS]> = Mutex::new([None; LISTENERS]);

/// (listener, result, count) of every certificate reload so far.
pub(crate) fn reload_counts() -> impl Iterator<Item = (ListenerName, ReloadResult, u64)> {
    ListenerName::ALL
        .into_iter()
        .flat_map(|l| ReloadResult::ALL.into_iter().map(move |r| (l, r, RELOADS[l as usize][r as usize].load(Ordering::Relaxed))))
}

/// (listener, not-after in Unix seconds) of every certificate served now.
pub(crate) fn expiries() -> Vec<(ListenerName, i64)> {
    let served = SERVED.lock().unwrap_or_else(PoisonError::into_inner);
    ListenerName::ALL.into_iter().filter_map(|l| served[l as usize].map(|(_, t)| (l, t))).collect()
}

fn owner(cert: &Arc<ServedCertificate>) -> usize {
    Arc::as_ptr(cert) as usize
}

fn publish(l: ListenerName, cert: &Arc<ServedCertificate>, facts: &CertificateFacts) {
    SERVED.lock().unwrap_or_else(PoisonError::into_inner)[l as usize] = Some((owner(cert), facts.not_after));
}

/// How long until `not_after` (negative: past), from the wall clock.
fn remaining(facts: &CertificateFacts) -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    facts.not_after.saturating_sub(now)
}

/// `seconds` as the log shows a remaining validity: `89d 23h`, `5h`, `<1h`, `-2d 0h` (past).
fn human(seconds: i64) -> String {
    let sign = if seconds < 0 { "-" } else { "" };
    let s = seconds.unsigned_abs();
    match (s / 86400, s % 86400 / 3600) {
        (0, 0) => format!("{sign}<1h"),
        (0, h) => format!("{sign}{h}h"),
        (d, h) => format!("{sign}{d}d {h}h"),
    }
}

/// A TLS listener's certificate while the listener serves: published, logged, reloaded on its
/// timer. Dropped with the listener: the timer stops and the expiry is no longer published.
pub(crate) struct CertificateWatch {
    listener: ListenerName,
    /// The listener's key prefix (`receivers.otlp.protocols.grpc`), for the keys errors name.
    prefix: &'static str,
    cert: Arc<ServedCertificate>,
    timer: Option<JoinHandle<()>>,
}

impl CertificateWatch {
    /// The listener `listener` (configured under `prefix`) starts serving `cert`. Runs on the
    /// Tokio runtime (the timer is a task).
    pub(crate) fn start(listener: ListenerName, prefix: &'static str, cert: Arc<ServedCertificate>) -> CertificateWatch {
        let facts = cert.facts();
        publish(listener, &cert, &facts);
        let left = remaining(&facts);
        let (subject, not_after, expires_in) = (facts.subject.as_str(), facts.not_after_rfc3339(), human(left));
        if left <= 0 {
            tracing::warn!(listener = listener.as_str(), subject, not_after, "TLS certificate served has expired");
        } else {
            tracing::info!(listener = listener.as_str(), subject, not_after, expires_in, "TLS certificate served");
        }
        let timer = cert.reload_interval().map(|every| {
            let cert = cert.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    reload(listener, prefix, &cert, Trigger::Interval);
                }
            })
        });
        CertificateWatch { listener, prefix, cert, timer }
    }

    /// Read the certificate and key again (SIGHUP).
    pub(crate) fn reload(&self, trigger: Trigger) {
        reload(self.listener, self.prefix, &self.cert, trigger);
    }
}

impl Drop for CertificateWatch {
    fn drop(&mut self) {
        if let Some(t) = self.timer.take() {
            t.abort();
        }
        let mut served = SERVED.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = &mut served[self.listener as usize];
        if slot.is_some_and(|(o, _)| o == owner(&self.cert)) {
            *slot = None;
        }
    }
}

fn reload(l: ListenerName, prefix: &str, cert: &Arc<ServedCertificate>, trigger: Trigger) {
    let listener = l.as_str();
    match cert.reload() {
        Ok(r) => {
            RELOADS[l as usize][ReloadResult::Ok as usize].fetch_add(1, Ordering::Relaxed);
            publish(l, cert, &r.facts);
            let (subject, not_after) = (r.facts.subject.as_str(), r.facts.not_after_rfc3339());
            let expires_in = human(remaining(&r.facts));
            let (trigger, changed) = (trigger.as_str(), r.changed);
            if remaining(&r.facts) <= 0 {
                tracing::warn!(listener, trigger, changed, subject, not_after, "TLS certificate reloaded; it has expired");
            } else {
                tracing::info!(listener, trigger, changed, subject, not_after, expires_in, "TLS certificate reloaded");
            }
        }
        Err(e) => {
            RELOADS[l as usize][ReloadResult::Failed as usize].fetch_add(1, Ordering::Relaxed);
            let kept = cert.facts();
            tracing::error!(
                listener,
                trigger = trigger.as_str(),
                key = %format!("{prefix}.tls.{}", e.key()),
                error = %e,
                subject = kept.subject.as_str(),
                not_after = kept.not_after_rfc3339(),
                "TLS certificate reload failed; the served certificate is kept"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_validity_reads_in_hours_and_days() {
        assert_eq!(human(90 * 86400 + 5000), "90d 1h");
        assert_eq!(human(2 * 86400 + 59), "2d 0h");
        assert_eq!(human(7300), "2h");
        assert_eq!(human(59), "<1h");
        assert_eq!(human(-7200), "-2h");
        assert_eq!(human(-5), "-<1h");
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

    #[test]
    fn a_reload_swaps_a_renewed_certificate_and_keeps_the_served_one_on_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = self_signed(dir.path(), "first.test");
        let s = crate::config::TlsServerSettings { cert_file: Some(cert.clone()), key_file: Some(key.clone()), ..Default::default() };
        let (_cfg, served) = s.build(&[b"h2"]).unwrap();
        let first = served.facts();
        assert_eq!(first.subject, "CN=rcgen self signed cert");
        let served_der = || served.current.read().unwrap().0.cert[0].clone();
        let first_der = served_der();
        assert!(!served.reload().unwrap().changed, "the same files: no change");

        // Renewed in place.
        let (c2, k2) = self_signed(dir.path(), "second.test");
        std::fs::copy(&c2, &cert).unwrap();
        std::fs::copy(&k2, &key).unwrap();
        let r = served.reload().unwrap();
        assert!(r.changed);
        let second_der = served_der();
        assert_ne!(second_der, first_der);
        assert_eq!(r.facts, served.facts());

        // A key that does not match the certificate: refused, the renewed one stays.
        std::fs::copy(dir.path().join("first.test.key"), &key).unwrap();
        let e = served.reload().unwrap_err();
        assert_eq!(e.key(), "key_file", "{e}");
        assert_eq!(served_der(), second_der);
        // Not a certificate at all.
        std::fs::copy(&k2, &key).unwrap();
        std::fs::write(&cert, "garbage").unwrap();
        assert_eq!(served.reload().unwrap_err().key(), "cert_file");
        assert_eq!(served_der(), second_der);
        assert_eq!(served.facts(), r.facts);
    }

    #[test]
    fn facts_read_the_not_after() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["x.test".to_string()]).unwrap();
        p.not_after = rcgen::date_time_ymd(2031, 5, 17);
        p.distinguished_name.push(rcgen::DnType::CommonName, "x.test");
        let der = p.self_signed(&key).unwrap().der().clone();
        let f = CertificateFacts::of(&der).unwrap();
        assert_eq!(f.subject, "CN=x.test");
        assert_eq!(f.not_after, 1_936_742_400, "2031-05-17T00:00:00Z");
        assert_eq!(f.not_after_rfc3339(), "2031-05-17T00:00:00Z");
        assert!(CertificateFacts::of(&CertificateDer::from(vec![0x30, 0x03, 1, 2, 3])).is_err());
    }
}
