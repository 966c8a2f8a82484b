//! The console's parts tested without a terminal: `update` drives the app
//! key by key, `frames` draws whole frames on a `TestBackend`, `client`
//! runs the admin client against a fake admin server. In the crate, so the
//! parts stay private; the binary's own test in a pseudo-terminal is in
//! `tests/it/`.

// Probabilities are set to exact tenths and compared as such.
#![allow(clippy::float_cmp)]

mod client;
// The fake admin server is shared with `tests/it/` (the binary's test in a
// pseudo-terminal), which uses parts of it these tests do not.
#[allow(dead_code)]
#[path = "../../tests/it/fake.rs"]
mod fake;
mod frames;
mod update;
