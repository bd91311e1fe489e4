//! The in-memory store: the records live as long as the store value does. With no store at all
//! (the default) the engine keeps its state in its own tables only; this one is for tests and for
//! comparing the embedded store against (the benchmark), and it is what a store that failed to
//! open degrades to in spirit: state for the life of the process.

use std::collections::BTreeMap;

use super::{Changes, Record, Snapshot, StateStore, StoreError, Table};

/// Records in a map, one transaction at a time.
#[derive(Default)]
pub struct MemoryStore {
    records: BTreeMap<(Table, String), Record>,
    shared: bool,
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// A store that says it is shared, for tests of several engines in one process taking turns
    /// on one store (one `StoreHandle`): they read each other's records as instances on Redis do.
    /// It has no versions, so it never refuses a write (the engines take turns, so none is
    /// lost), and it grants the gauge lease to every engine.
    pub fn shared() -> Self {
        MemoryStore { shared: true, ..MemoryStore::default() }
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

    fn is_shared(&self) -> bool {
        self.shared
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
