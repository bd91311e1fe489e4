//! The in-memory store: the records live as long as the store value does. With no store at all
//! (the default) the engine keeps its state in its own tables only; this one is for tests and for
//! comparing the embedded store against (the benchmark), and it is what a store that failed to
//! open degrades to in spirit: state for the life of the process. [`SharedMemory`] is the same
//! shared by several engines in one process, each through a client of its own, as instances
//! share Redis.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::{Changes, Record, Snapshot, StateStore, StoreError, Table};

/// Records in a map, one transaction at a time.
#[derive(Default)]
pub struct MemoryStore {
    records: BTreeMap<(Table, String), Record>,
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// How many records it holds.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

impl StateStore for MemoryStore {
    fn load_into(&mut self, mut s: Snapshot) -> Result<Snapshot, StoreError> {
        for ((_, key), r) in &self.records {
            s.push_record(key, r);
        }
        s.settle();
        Ok(s)
    }

    fn get(&mut self, table: Table, key: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.records.get(&(table, key.to_string())).cloned())
    }

    fn apply(&mut self, changes: &Changes) -> Result<(), StoreError> {
        for c in &changes.changes {
            match &c.value {
                Some(r) => {
                    self.records.insert((c.table, c.key.clone()), r.clone());
                }
                None => {
                    self.records.remove(&(c.table, c.key.clone()));
                }
            }
        }
        Ok(())
    }
}

/// Records several engines in one process share (tests of instances side by side): each engine
/// writes through its own [`SharedMemoryStore`], which remembers the version of every record it
/// read or wrote and is refused a write where another engine changed the record since — the
/// compare-and-set instances meet on Redis, so that the conflicts (two engines revising one
/// call in the same step) happen here too. Deletes leave a tombstone, as on Redis; here nothing
/// expires (tombstones, the shared lists), and neither the records nor what a client remembers
/// is bounded: it is for tests, which write a few hundred records.
#[derive(Clone, Default)]
pub struct SharedMemory(Arc<Mutex<Versioned>>);

#[derive(Default)]
struct Versioned {
    /// Each key's version and record (`None`: deleted at that version).
    records: BTreeMap<(Table, String), (u64, Option<Record>)>,
    last: u64,
}

impl SharedMemory {
    /// A client of these records for one engine, with its own view of their versions.
    pub fn instance(&self) -> SharedMemoryStore {
        SharedMemoryStore { memory: self.clone(), seen: HashMap::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Versioned> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What a client last saw of a key: a record at a version, or deleted at a version (a write
/// then expects that tombstone, or nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Record(u64),
    Gone(u64),
}

/// One engine's client of a [`SharedMemory`].
pub struct SharedMemoryStore {
    memory: SharedMemory,
    seen: HashMap<(Table, String), Seen>,
}

impl SharedMemoryStore {
    fn remember(&mut self, key: (Table, String), at: Option<&(u64, Option<Record>)>) {
        match at {
            Some((v, Some(_))) => self.seen.insert(key, Seen::Record(*v)),
            Some((v, None)) => self.seen.insert(key, Seen::Gone(*v)),
            None => self.seen.remove(&key),
        };
    }
}

impl StateStore for SharedMemoryStore {
    fn load_into(&mut self, mut s: Snapshot) -> Result<Snapshot, StoreError> {
        let memory = self.memory.clone();
        let m = memory.lock();
        for (key, at) in &m.records {
            if let (_, Some(r)) = at {
                s.push_record(&key.1, r);
            }
            self.remember(key.clone(), Some(at));
        }
        s.settle();
        Ok(s)
    }

    fn get(&mut self, table: Table, key: &str) -> Result<Option<Record>, StoreError> {
        let memory = self.memory.clone();
        let m = memory.lock();
        let key = (table, key.to_string());
        let at = m.records.get(&key);
        self.remember(key, at);
        Ok(at.and_then(|(_, r)| r.clone()))
    }

    fn peek(&mut self, table: Table, key: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.memory.lock().records.get(&(table, key.to_string())).and_then(|(_, r)| r.clone()))
    }

    fn is_shared(&self) -> bool {
        true
    }

    /// Each change is written if the key is as this client last saw it, and refused otherwise
    /// (the rest written), as the Redis store's script does.
    fn apply(&mut self, changes: &Changes) -> Result<(), StoreError> {
        let memory = self.memory.clone();
        let mut m = memory.lock();
        m.last += 1;
        let n = m.last;
        let mut refused = Vec::new();
        for c in &changes.changes {
            let key = (c.table, c.key.clone());
            let as_seen = match (self.seen.get(&key), m.records.get(&key)) {
                (None, have) => have.is_none(),
                (Some(Seen::Record(v)), Some((have, Some(_)))) => v == have,
                (Some(Seen::Gone(_)), None) => true,
                (Some(Seen::Gone(v)), Some((have, None))) => v == have,
                _ => false,
            };
            if !as_seen {
                refused.push(key);
                continue;
            }
            let at = (n, c.value.clone());
            self.remember(key.clone(), Some(&at));
            m.records.insert(key, at);
        }
        match refused.first().cloned() {
            Some((table, key)) => Err(StoreError::Conflict { table: table.as_str(), key, refused }),
            None => Ok(()),
        }
    }
}
