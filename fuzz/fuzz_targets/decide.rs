//! Fuzzes `idem_guest` through `idem_guest::fuzzing::check_decide`, which panics
//! when an invariant breaks. A crash saved under `fuzz/regressions/decide/`
//! replays in `cargo test -p idem-guest`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem_guest::fuzzing::check_decide(data));
