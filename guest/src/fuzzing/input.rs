//! The fuzzer's bytes, read as the guard's inputs.

use crate::model::{Policy, Record, Response, State};

/// Reads inputs from the fuzzer's bytes; past the end, zeros.
pub(super) struct Input<'a>(pub(super) &'a [u8]);

impl Input<'_> {
    pub(super) fn u8(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        first
    }

    pub(super) fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, _| (acc << 8) | u64::from(self.u8()))
    }

    /// Mostly small numbers, sometimes huge ones (overflow edges).
    pub(super) fn ms(&mut self) -> u64 {
        match self.u8() % 8 {
            0 => self.u64(),
            1 => u64::MAX - u64::from(self.u8()),
            _ => u64::from(self.u8()) * 16 + u64::from(self.u8() % 16),
        }
    }

    pub(super) fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = (usize::from(self.u8()) | (usize::from(self.u8()) << 8)) % (max + 1);
        let len = len.min(self.0.len());
        let (taken, rest) = self.0.split_at(len);
        self.0 = rest;
        taken.to_vec()
    }

    pub(super) fn string(&mut self, max: usize) -> String {
        String::from_utf8_lossy(&self.bytes(max)).into_owned()
    }

    /// A key or fingerprint from a small set (so they collide), or arbitrary text.
    pub(super) fn name(&mut self, pool: &[&str], max: usize) -> String {
        let pick = usize::from(self.u8());
        match pool.get(pick % (pool.len() + 1)) {
            Some(name) => (*name).to_string(),
            None => self.string(max),
        }
    }

    pub(super) fn policy(&mut self) -> Policy {
        Policy {
            lease_ms: self.ms(),
            retention_ms: self.ms(),
            max_response_bytes: u32::from(self.u8()) * 4,
        }
    }

    /// A guard call's policy: one time in four an arbitrary one, else a
    /// valid one, so that most calls get past the checks.
    pub(super) fn call_policy(&mut self) -> Policy {
        if self.u8().is_multiple_of(4) {
            self.policy()
        } else {
            Policy {
                lease_ms: 100,
                retention_ms: 1_000,
                max_response_bytes: 64,
            }
        }
    }

    pub(super) fn response(&mut self) -> Response {
        let status = match self.u8() % 4 {
            0 => u16::from(self.u8()) | (u16::from(self.u8()) << 8),
            _ => 200 + u16::from(self.u8() % 8),
        };
        let headers = (0..self.u8() % 3)
            .map(|_| (self.string(8), self.bytes(8)))
            .collect();
        Response {
            status,
            headers,
            body: self.bytes(64),
        }
    }

    pub(super) fn record(&mut self) -> Record {
        let state = if self.u8().is_multiple_of(2) {
            State::Processing
        } else {
            State::Done
        };
        Record {
            fingerprint: self.name(&["fp", "fp2"], 8),
            state,
            holder: u64::from(self.u8() % 3),
            lease_until_ms: self.ms(),
            expires_at_ms: self.ms(),
            response: (state == State::Done).then(|| self.response()),
            checkpoint: None,
        }
    }
}
