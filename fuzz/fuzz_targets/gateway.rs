//! Fuzzes the gateway's parsing of its inputs — the `Idempotency-Key`
//! header, client scopes, fingerprinted and hop-by-hop headers, problem
//! bodies, durations, `--in-flight` and fault rules — through
//! `idem::fuzzing::check_gateway`, which panics when an invariant breaks.
//! A crash saved under `fuzz/regressions/gateway/` replays in
//! `cargo test -p idem`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| idem::fuzzing::check_gateway(data));
