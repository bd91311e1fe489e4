//! Format version 0: the layouts 0.1.0 wrote (bare postcard, no frame; see `super::format`), kept
//! so that an upgrade reads what the previous release wrote and migrates it to today's.

use super::{Record, StoreError, Table};

/// A record of `table` as 0.1.0 wrote it, in today's types.
pub(super) fn decode(table: Table, key: &str, bytes: &[u8]) -> Result<Record, StoreError> {
    Record::decode_current(table, key, bytes)
}
