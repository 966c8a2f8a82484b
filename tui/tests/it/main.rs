//! idem-tui's one integration test binary: the real `idem-tui` binary in a
//! pseudo-terminal against a fake admin server. The tests of the console's
//! parts (update, frames, the admin client) are in the crate, in
//! `src/tests/`; both run against the fake server of `testkit/fake-admin`.

mod terminal;
