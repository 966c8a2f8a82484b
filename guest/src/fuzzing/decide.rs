//! The `decide` fuzz target's check.

use super::input::Input;
use crate::decide::{Verdict, decide};
use crate::model::{Entry, State};

/// `decide` returns the verdict the contract names for every stored record,
/// time and fingerprint.
pub fn check_decide(data: &[u8]) {
    let mut input = Input(data);
    let stored = (input.u8() % 4 != 0).then(|| Entry {
        record: input.record(),
        version: input.u64(),
    });
    let now = input.ms();
    let fingerprint = input.name(&["fp", "fp2"], 8);
    let verdict = decide(stored.as_ref(), now, &fingerprint);
    let live = stored
        .as_ref()
        .filter(|e| now < e.record.expires_at_ms)
        .map(|e| &e.record);
    match verdict {
        Verdict::Claim => assert!(live.is_none(), "claim over a live record {live:?}"),
        Verdict::Conflict => assert!(
            live.is_some_and(|r| r.fingerprint != fingerprint),
            "conflict without another fingerprint"
        ),
        Verdict::Replay => {
            let r = live.expect("replay needs a live record");
            assert_eq!(
                r.fingerprint, fingerprint,
                "replay of another fingerprint's response"
            );
            assert_eq!(r.state, State::Done);
        }
        Verdict::InFlight { retry_after_ms } => {
            let r = live.expect("in flight needs a live record");
            assert_eq!(
                (r.fingerprint.as_str(), r.state),
                (fingerprint.as_str(), State::Processing)
            );
            assert!(
                retry_after_ms >= 1 && now + retry_after_ms == r.lease_until_ms,
                "retry after {retry_after_ms} ms at {now} for {r:?}"
            );
        }
        Verdict::TakeOver => {
            let r = live.expect("takeover needs a live record");
            assert_eq!(
                (r.fingerprint.as_str(), r.state),
                (fingerprint.as_str(), State::Processing)
            );
            assert!(now >= r.lease_until_ms, "takeover within the lease");
        }
    }
}
