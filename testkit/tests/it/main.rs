//! The tests that need `idem-testkit` processes: the chaos soak, crash
//! recovery after `kill -9`, two processes racing for the same keys, and
//! SQLite's durability. One binary, to keep link times down.

// Pedantic lints guard library code; in tests they are noise.
#![allow(clippy::pedantic)]

mod crash;
mod multiprocess;
mod soak;
mod sqlite;
mod support;
