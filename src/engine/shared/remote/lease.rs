//! The store's standing and the gauge lease: a store that is down is probed (and chains held for
//! it a while); the lease's holder counts every instance's incidents and sessions; the lease's
//! renewal announces this instance's state protocol and hears the cluster's.

use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::classify::catalog::Convergence;
use crate::correlate::outbox::FromStore;
use crate::evidence::time::Moment;
use crate::state::{Record, StateStore, StoreError, Table};

use super::super::worker::Ticket;
use super::super::{GaugeSource, GlobalCounts, Tables};
use super::Shared;

/// The gauge lease: renewed every re-evaluation (1 s), lost `GAUGE_LEASE` after its holder
/// stops renewing it.
pub(super) const GAUGE_LEASE: Duration = Duration::from_secs(5);
/// How often the holder of the gauge lease counts every instance's incidents and sessions in the
/// store (one `SCAN` of each table).
const GLOBAL_GAUGES_EVERY: Duration = Duration::from_secs(10);
/// How long chains wait for a store that is down before they are decided without it.
const STORE_DOWN_HOLD: Duration = Duration::from_secs(5);

/// The lease's answer: held, (when counted) the global figures, and the cluster's state
/// protocol (the announcement is renewed with the lease).
type LeaseAnswer = (Result<bool, StoreError>, Option<Result<GlobalCounts, StoreError>>, Result<u32, StoreError>);

/// The lease's and the probe's own state.
pub(super) struct Lease {
    answer: Option<(Moment, Ticket<LeaseAnswer>)>,
    probe: Option<(Moment, Ticket<Result<(), StoreError>>)>,
    /// Since when the store has been down (see `hold_for_store`), and its last probe.
    store_down_since: Option<Moment>,
    last_probe: Option<Moment>,
    leader: bool,
    /// What the lease holder last counted, and when (engine time).
    global_gauges: Option<(Moment, GlobalCounts)>,
    /// The cluster's state protocol as last announced, and whether the chains know it yet.
    cluster_protocol: Option<u32>,
    cluster_protocol_told: bool,
}

impl Lease {
    pub(super) fn new() -> Self {
        Lease {
            answer: None,
            probe: None,
            store_down_since: None,
            last_probe: None,
            leader: false,
            global_gauges: None,
            cluster_protocol: None,
            cluster_protocol_told: true,
        }
    }

    /// This instance holds the gauge lease.
    pub(super) fn leader(&self) -> bool {
        self.leader
    }

    /// The global gauges while this instance holds the lease.
    pub(super) fn gauges(&self) -> GaugeSource<'_> {
        match &self.global_gauges {
            Some((_, counts)) if self.leader => GaugeSource::Global(counts),
            _ => GaugeSource::Elsewhere,
        }
    }
}

impl Shared {
    /// On a store that is down, chains are not decided for up to [`STORE_DOWN_HOLD`]: another
    /// instance's part of their evidence (a session's signal, a refused request, a verifier) is
    /// in the store, and a verdict without it would be a guess (a stale catalog judged fine).
    /// The store is asked every `PERSIST_EVERY` meanwhile; past the hold, chains are decided,
    /// partial (`store_unavailable`). True while holding.
    pub(super) fn hold_for_store(&mut self, now: Moment) -> bool {
        if !self.link.down {
            self.lease.store_down_since = None;
            return false;
        }
        let since = *self.lease.store_down_since.get_or_insert(now);
        if self.lease.last_probe.is_none_or(|at| now.saturating_duration_since(at) >= crate::state::PERSIST_EVERY) {
            self.lease.last_probe = Some(now);
            self.probe_store();
        }
        if !self.link.down {
            self.lease.store_down_since = None;
            return false;
        }
        now.saturating_duration_since(since) < STORE_DOWN_HOLD
    }

    /// Ask a store marked down whether it answers again (the answer is taken when it comes).
    pub(super) fn probe_store(&mut self) {
        if !self.link.down || self.lease.probe.is_some() {
            return;
        }
        let ticket = self.link.worker.submit(|s| s.probe().unwrap_or(Err(StoreError::Backend(String::new()))));
        self.lease.probe = Some((self.now, ticket));
        self.take_probe();
    }

    pub(super) fn take_probe(&mut self) {
        let Some((at, p)) = self.lease.probe.take() else { return };
        if self.due(at) {
            self.link.worker.wait(&p);
        }
        if !self.link.worker.has(&p) {
            self.lease.probe = Some((at, p));
            return;
        }
        if let Some(Ok(())) = self.link.worker.take(p) {
            if self.link.down {
                self.link.down = false;
                tracing::info!("the state store answers again");
            }
        }
    }

    /// Take or renew the gauge lease; its holder counts every instance's open incidents and
    /// sessions in the store every [`GLOBAL_GAUGES_EVERY`]. A store error drops the lease here
    /// (another instance takes it once it expires) and is counted.
    pub(super) fn renew_gauge_lease(&mut self, now: Moment) {
        if self.lease.answer.is_some() {
            return;
        }
        let count = self.lease.global_gauges.as_ref().is_none_or(|(at, _)| now.saturating_duration_since(*at) >= GLOBAL_GAUGES_EVERY);
        let ticket = self.link.worker.submit(move |s| {
            let held = s.lease(GAUGE_LEASE);
            let counts = match &held {
                Ok(true) if count => Some(count_global(s)),
                _ => None,
            };
            (held, counts, s.announce(GAUGE_LEASE))
        });
        self.lease.answer = Some((now, ticket));
        self.take_lease();
    }

    /// The cluster's state protocol, as the store answered an announcement: told to the chains
    /// at the next step (`tell_protocol`), logged when it changes.
    pub(super) fn heard_protocol(&mut self, p: u32) {
        if self.lease.cluster_protocol != Some(p) {
            if self.lease.cluster_protocol.is_some() || p < crate::state::format::PROTOCOL {
                tracing::info!(
                    cluster = p,
                    this_build = crate::state::format::PROTOCOL,
                    "the instances sharing the state store speak state protocol {p} (the lowest announced)"
                );
            }
            self.lease.cluster_protocol = Some(p);
            self.lease.cluster_protocol_told = false;
        }
    }

    pub(super) fn tell_protocol(&mut self, t: &mut Tables, now: Moment) {
        if let (Some(p), false) = (self.lease.cluster_protocol, self.lease.cluster_protocol_told) {
            t.chains.take_in(FromStore::Protocol(p), now, &mut Vec::new());
            self.lease.cluster_protocol_told = true;
        }
    }

    pub(super) fn take_lease(&mut self) {
        let Some((at, t)) = self.lease.answer.take() else { return };
        if self.due(at) {
            self.link.worker.wait(&t);
        }
        if !self.link.worker.has(&t) {
            self.lease.answer = Some((at, t));
            return;
        }
        let Some((held, counts, protocol)) = self.link.worker.take(t) else { return };
        match protocol {
            Ok(p) => self.heard_protocol(p),
            Err(e) => tracing::warn!(error = %e, "could not announce this instance's state protocol"),
        }
        let held = match held {
            Ok(h) => h,
            Err(e) => {
                self.link.failed();
                tracing::warn!(error = %e, "could not renew the gauge lease");
                false
            }
        };
        if held != self.lease.leader {
            tracing::info!(
                leader = held,
                "gauge lease: this instance {} the global gauges",
                if held { "reports" } else { "no longer reports" }
            );
        }
        self.lease.leader = held;
        if !held {
            self.lease.global_gauges = None;
            return;
        }
        match counts {
            Some(Ok(c)) => self.lease.global_gauges = Some((at, c)),
            Some(Err(e)) => {
                self.link.failed();
                tracing::warn!(error = %e, "could not count the incidents and sessions in the state store");
            }
            None => {}
        }
    }
}

/// Every instance's open incidents and sessions, counted in the store (the lease holder).
fn count_global(s: &mut dyn StateStore) -> Result<GlobalCounts, StoreError> {
    let incidents = s.scan(Table::Incidents)?;
    let sessions = s.scan(Table::Sessions)?;
    let mut open = FxHashMap::default();
    for (_, r) in &incidents {
        if let Record::Incidents(part) = r {
            super::super::super::count_open(&mut open, part.open.iter());
        }
    }
    let mut convergence: FxHashMap<(String, Convergence), u64> = FxHashMap::default();
    for (_, r) in &sessions {
        if let Record::Session(s) = r {
            if let Some(c) = s.last {
                *convergence.entry((s.server.as_deref().unwrap_or("").to_string(), c)).or_default() += 1;
            }
        }
    }
    Ok((open, convergence))
}
