//! Split marks: a server seen to split its calls across instances is marked in the store, so
//! every instance publishes its client halves for that server; the marks are read and written
//! with each write round.

use crate::correlate::outbox::{FromStore, Restore};
use crate::correlate::splits::Server;
use crate::evidence::time::Moment;
use crate::state::{server_key, Changes, Record, SplitRecord};

use super::super::Tables;

/// The servers of a write round's split marks: those marked here (written unless the store has
/// them), then the others asked for (those whose client halves are held back here).
pub(super) struct SplitsJob {
    servers: Vec<Server>,
    marked: usize,
}

/// The split marks of a write round: those marked here since the last, then the servers whose
/// client halves are held back here (to learn whether another instance marked them).
pub(super) fn splits_job(mut marks: Vec<Server>, ask: Vec<Server>) -> SplitsJob {
    let marked = marks.len();
    // A marked server is known here, so never among those asked for.
    marks.extend(ask);
    SplitsJob { servers: marks, marked }
}

impl SplitsJob {
    /// The keys of the servers' records.
    pub(super) fn keys(&self) -> Vec<String> {
        self.servers.iter().map(|s| server_key(s.as_deref())).collect()
    }
}

/// The split marks a round read: a server the store has marked is learned (its held-back halves
/// published); one marked here that the store lacks is written with this round (the marks to
/// write are returned). Without the read (it failed), the marks wait for the next round.
pub(super) fn take_split_read(
    t: &mut Tables,
    now: Moment,
    job: SplitsJob,
    read: Option<Vec<Option<Record>>>,
    changes: &mut Changes,
) -> Vec<Server> {
    let Some(records) = read else {
        t.chains.restore(Restore::MarksAgain(job.servers.into_iter().take(job.marked).collect()));
        return Vec::new();
    };
    let mut marks = Vec::new();
    for (i, (server, r)) in job.servers.into_iter().zip(records.into_iter().chain(std::iter::repeat(None))).enumerate() {
        match r {
            Some(Record::Split(_)) => t.chains.take_in(FromStore::Split(server), now, &mut Vec::new()),
            _ if i < job.marked => {
                changes.put(server_key(server.as_deref()), Record::Split(SplitRecord { server: server.clone() }));
                marks.push(server);
            }
            _ => {}
        }
    }
    marks
}
