//! The store the `guard` check runs the guard over, with faults the input
//! schedules; the guard's unit tests use it too, without faults.

use std::collections::HashMap;

use crate::guard::Primitives;
use crate::model::{Entry, InsertOutcome, Record, StoreFailure};

/// A store of one process's memory: the primitives' contract at its
/// simplest, with the faults its user schedules.
#[derive(Default)]
pub(crate) struct Map {
    pub(crate) now: u64,
    pub(crate) records: HashMap<String, Entry>,
    /// How many writes were applied.
    pub(crate) writes: usize,
    /// The next store call fails (and, if `lost`, is applied first).
    pub(crate) fail_next: Option<bool>,
    /// Holder ids handed out so far: the next is one more.
    pub(crate) holders: u64,
}

impl Map {
    fn fault(&mut self) -> Option<bool> {
        self.fail_next.take()
    }

    /// A write under the next fault: `refused` before it is applied, or
    /// applied and its reply lost.
    fn write<T>(
        &mut self,
        refused: StoreFailure,
        apply: impl FnOnce(&mut Self) -> T,
    ) -> Result<T, StoreFailure> {
        let fault = self.fault();
        if fault == Some(false) {
            return Err(refused);
        }
        let outcome = apply(self);
        if fault == Some(true) {
            return Err(StoreFailure::Unavailable("reply lost".into()));
        }
        Ok(outcome)
    }
}

impl Primitives for Map {
    type Response = crate::model::Response;

    fn now_ms(&mut self) -> u64 {
        self.now
    }

    fn random_u64(&mut self) -> u64 {
        self.holders += 1;
        self.holders
    }

    fn get(&mut self, key: &str, now: u64) -> Result<Option<Entry>, StoreFailure> {
        if self.fault() == Some(false) {
            return Err(StoreFailure::Unavailable("injected".into()));
        }
        Ok(self
            .records
            .get(key)
            .filter(|e| e.record.is_live(now))
            .cloned())
    }

    fn insert(
        &mut self,
        key: &str,
        record: &Record,
        now: u64,
    ) -> Result<InsertOutcome, StoreFailure> {
        let refused = StoreFailure::Unavailable("injected".into());
        self.write(refused, |map| match map.records.get(key) {
            Some(e) if e.record.is_live(now) => InsertOutcome::Existing(e.clone()),
            old => {
                let version = old.map_or(1, |e| e.version + 1);
                map.records.insert(
                    key.into(),
                    Entry {
                        record: record.clone(),
                        version,
                    },
                );
                map.writes += 1;
                InsertOutcome::Inserted(version)
            }
        })
    }

    fn replace(
        &mut self,
        key: &str,
        expected: u64,
        record: &Record,
        now: u64,
    ) -> Result<bool, StoreFailure> {
        let refused = StoreFailure::Corrupt("injected".into());
        self.write(refused, |map| match map.records.get_mut(key) {
            Some(e) if e.record.is_live(now) && e.version == expected && expected < u64::MAX => {
                *e = Entry {
                    record: record.clone(),
                    version: expected + 1,
                };
                map.writes += 1;
                true
            }
            _ => false,
        })
    }
}
