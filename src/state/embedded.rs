//! The embedded durable store: one [redb](https://docs.rs/redb) file, `state.redb`, in
//! `storage.directory`.
//!
//! Why redb rather than fjall: redb is pure Rust, one file, an ACID copy-on-write B-tree whose
//! commit is one fsync'd transaction — exactly the unit the engine writes (all the changes of a
//! step or none) — with no background threads to start, stop or account for, and a stable file
//! format. fjall is an LSM tree with background flush and compaction threads: faster for heavy
//! write loads than this one (a transaction every 100 ms at most), but more moving parts on a
//! 2-core box and a shutdown to coordinate. redb 2.x is the line that builds on the project's
//! minimum Rust (1.88).
//!
//! Each table of [`Table`] is a redb table `&str -> &[u8]` (records encoded by
//! [`Record::encode`]). A crash (SIGKILL) loses at most the changes since the last commit; a
//! commit is atomic, so the file is never half written.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableTable, TableDefinition};

use super::{Changes, Record, Snapshot, StateStore, StoreError, Table};

fn def(t: Table) -> TableDefinition<'static, &'static str, &'static [u8]> {
    TableDefinition::new(t.as_str())
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// The redb store.
pub(crate) struct EmbeddedStore {
    db: Database,
    path: PathBuf,
    read: super::ReadPolicy,
}

impl EmbeddedStore {
    /// Open (or create) `state.redb` in `directory` (created if missing).
    pub(crate) fn open(directory: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(directory)?;
        let path = directory.join("state.redb");
        let db = Database::create(&path).map_err(backend)?;
        // Create every table once, so a read of a fresh file finds them.
        let tx = db.begin_write().map_err(backend)?;
        for t in Table::ALL {
            tx.open_table(def(t)).map_err(backend)?;
        }
        tx.commit().map_err(backend)?;
        Ok(EmbeddedStore { db, path, read: super::ReadPolicy::default() })
    }

    /// Write records' bytes as they are (tests: damaged records, records of other versions).
    #[cfg(test)]
    pub(crate) fn put_raw(&mut self, rows: &[(Table, String, Vec<u8>)]) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(backend)?;
        for (t, k, v) in rows {
            tx.open_table(def(*t)).map_err(backend)?.insert(k.as_str(), v.as_slice()).map_err(backend)?;
        }
        tx.commit().map_err(backend)
    }

    /// A record's bytes as stored.
    #[cfg(test)]
    pub(crate) fn get_raw(&self, table: Table, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let tx = self.db.begin_read().map_err(backend)?;
        let t = tx.open_table(def(table)).map_err(backend)?;
        Ok(t.get(key).map_err(backend)?.map(|v| v.value().to_vec()))
    }
}

impl StateStore for EmbeddedStore {
    fn set_read_policy(&mut self, read: super::ReadPolicy) {
        self.read = read;
    }

    fn load_into(&mut self, mut s: Snapshot) -> Result<Snapshot, StoreError> {
        let tx = self.db.begin_read().map_err(backend)?;
        for t in Table::ALL {
            let table = tx.open_table(def(t)).map_err(backend)?;
            for row in table.iter().map_err(backend)? {
                let (k, v) = row.map_err(backend)?;
                s.push_encoded(t, k.value(), v.value(), self.read);
            }
        }
        s.settle();
        Ok(s)
    }

    fn get(&mut self, table: Table, key: &str) -> Result<Option<Record>, StoreError> {
        let tx = self.db.begin_read().map_err(backend)?;
        let t = tx.open_table(def(table)).map_err(backend)?;
        match t.get(key).map_err(backend)? {
            // One that cannot be read is read as absent (the load named it).
            Some(v) => Ok(Record::decode_with(table, key, v.value(), self.read).ok()),
            None => Ok(None),
        }
    }

    fn apply(&mut self, changes: &Changes) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let tx = self.db.begin_write().map_err(backend)?;
        {
            let mut tables = Vec::with_capacity(Table::ALL.len());
            for t in Table::ALL {
                tables.push(tx.open_table(def(t)).map_err(backend)?);
            }
            for c in &changes.changes {
                let table = &mut tables[Table::ALL.iter().position(|t| *t == c.table).unwrap_or(0)];
                match &c.value {
                    Some(r) => {
                        let bytes = r.encode()?;
                        table.insert(c.key.as_str(), bytes.as_slice()).map_err(backend)?;
                    }
                    None => {
                        table.remove(c.key.as_str()).map_err(backend)?;
                    }
                }
            }
        }
        tx.commit().map_err(backend)?;
        Ok(())
    }

    fn bytes_on_disk(&self) -> Option<u64> {
        std::fs::metadata(&self.path).ok().map(|m| m.len())
    }
}
