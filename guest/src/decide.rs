//! The decision table: given what the store holds for a key, the time and
//! the repeat's fingerprint, what happens. No I/O, no clock.

use crate::model::{Entry, State};

/// What `begin` does about a key, before any write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Absent or expired: claim it with an insert.
    Claim,
    /// Processing, lease run out, same fingerprint: claim it by replacing
    /// the record at its version.
    TakeOver,
    /// Done, same fingerprint.
    Replay,
    /// Processing within its lease: retry after this many milliseconds.
    InFlight { retry_after_ms: u64 },
    /// Another fingerprint, whatever the state.
    Conflict,
}

pub fn decide<R>(stored: Option<&Entry<R>>, now_ms: u64, fingerprint: &str) -> Verdict {
    let Some(entry) = stored.filter(|e| e.record.is_live(now_ms)) else {
        return Verdict::Claim;
    };
    let record = &entry.record;
    if record.fingerprint != fingerprint {
        return Verdict::Conflict;
    }
    match record.state {
        State::Done => Verdict::Replay,
        State::Processing if now_ms < record.lease_until_ms => Verdict::InFlight {
            retry_after_ms: record.lease_until_ms - now_ms,
        },
        State::Processing => Verdict::TakeOver,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Record, Response};

    fn entry(fingerprint: &str, state: State, lease_until_ms: u64, expires_at_ms: u64) -> Entry {
        let response = (state == State::Done).then(|| Response {
            status: 200,
            ..Response::default()
        });
        Entry {
            record: Record {
                fingerprint: fingerprint.into(),
                state,
                holder: 1,
                lease_until_ms,
                expires_at_ms,
                response,
                checkpoint: None,
            },
            version: 1,
        }
    }

    #[test]
    fn table() {
        use State::{Done, Processing};
        use Verdict::*;
        // (stored record, now, request fingerprint) -> verdict
        let cases: &[(Option<Entry>, u64, &str, Verdict)] = &[
            (None, 100, "a", Claim),
            (Some(entry("a", Processing, 200, 1000)), 1000, "a", Claim), // expired exactly at expires_at
            (Some(entry("a", Done, 0, 1000)), 5000, "b", Claim), // expired: other fingerprint is new again
            (
                Some(entry("a", Processing, 200, 1000)),
                100,
                "a",
                InFlight {
                    retry_after_ms: 100,
                },
            ),
            (
                Some(entry("a", Processing, 200, 1000)),
                199,
                "a",
                InFlight { retry_after_ms: 1 },
            ),
            (Some(entry("a", Processing, 200, 1000)), 200, "a", TakeOver), // lease ends at lease_until
            (Some(entry("a", Processing, 200, 1000)), 999, "a", TakeOver),
            (Some(entry("a", Processing, 200, 1000)), 100, "b", Conflict), // conflict during a lease
            (Some(entry("a", Processing, 200, 1000)), 300, "b", Conflict), // and after it
            (Some(entry("a", Done, 0, 1000)), 100, "a", Replay),
            (Some(entry("a", Done, 0, 1000)), 999, "a", Replay),
            (Some(entry("a", Done, 0, 1000)), 100, "b", Conflict),
        ];
        for (i, (stored, now, fingerprint, want)) in cases.iter().enumerate() {
            assert_eq!(
                decide(stored.as_ref(), *now, fingerprint),
                *want,
                "case {i}"
            );
        }
    }
}
