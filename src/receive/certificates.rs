//! The certificates the TLS listeners serve, while they serve them: each is logged (subject and
//! not-after) when its listener starts and at every reload, its not-after is published for
//! `mcp_health.tls.certificate_expiry_timestamp`, and every reload is counted in
//! `mcp_health.tls.reloads` by result.
//!
//! A reload comes from SIGHUP ([`CertificateWatch::reload`]) or from the listener's
//! `tls.reload_interval` (a timer the watch owns). A certificate or key that cannot be read or
//! used leaves the served certificate in place; the error log says so and names the key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::task::JoinHandle;

use crate::receive::listen::ListenerName;
use crate::receive::tls::{CertificateFacts, ServedCertificate};

/// What asked for a reload (the log's `trigger`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    Sighup,
    Interval,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Sighup => "SIGHUP",
            Trigger::Interval => "reload_interval",
        }
    }
}

/// How a reload ended (`mcp_health.tls.reloads{result}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReloadResult {
    Ok,
    Failed,
}

impl ReloadResult {
    pub const ALL: [ReloadResult; 2] = [ReloadResult::Ok, ReloadResult::Failed];

    pub fn as_str(self) -> &'static str {
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
pub fn reload_counts() -> impl Iterator<Item = (ListenerName, ReloadResult, u64)> {
    ListenerName::ALL
        .into_iter()
        .flat_map(|l| ReloadResult::ALL.into_iter().map(move |r| (l, r, RELOADS[l as usize][r as usize].load(Ordering::Relaxed))))
}

/// (listener, not-after in Unix seconds) of every certificate served now.
pub fn expiries() -> Vec<(ListenerName, i64)> {
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
pub struct CertificateWatch {
    listener: ListenerName,
    /// The listener's key prefix (`receivers.otlp.protocols.grpc`), for the keys errors name.
    prefix: &'static str,
    cert: Arc<ServedCertificate>,
    timer: Option<JoinHandle<()>>,
}

impl CertificateWatch {
    /// The listener `listener` (configured under `prefix`) starts serving `cert`. Runs on the
    /// Tokio runtime (the timer is a task).
    pub fn start(listener: ListenerName, prefix: &'static str, cert: Arc<ServedCertificate>) -> CertificateWatch {
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
    pub fn reload(&self, trigger: Trigger) {
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
}
