//! idem-tui's one integration test binary.

// Probabilities are set to exact tenths and compared as such.
#![allow(clippy::float_cmp)]

mod client;
mod fake;
mod frames;
mod terminal;
mod update;
