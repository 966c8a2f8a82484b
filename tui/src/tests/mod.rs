//! The console's parts tested without a terminal: `update` drives the app
//! key by key, `frames` draws whole frames on a `TestBackend`, `client`
//! runs the admin client against the fake admin server of
//! `testkit/fake-admin`. In the crate, so the parts stay private; the
//! binary's own test in a pseudo-terminal is in `tests/it/`.

// Probabilities are set to exact tenths and compared as such.
#![allow(clippy::float_cmp)]

mod client;
mod frames;
mod update;
