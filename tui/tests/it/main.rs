//! idem-tui's one integration test binary.

mod client;
mod fake;
mod frames;
mod terminal;
mod update;
