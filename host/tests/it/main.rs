//! The host's integration tests, one binary to keep link times down.

// Pedantic lints guard library code; in tests and benches they are noise.
#![allow(clippy::pedantic)]

mod admin_contract;
mod admin_token;
mod cli;
mod clock;
mod cluster;
mod composed;
mod conformance;
mod console;
mod demo;
mod engine;
mod gateway;
mod guard;
mod hostile;
mod ledger;
mod metrics;
mod model;
mod netstores;
mod observe;
mod proxy;
mod readme;
mod sandbox;
mod scenarios;
mod seed;
mod sqlite;
mod stays_up;
mod store_open;
mod support;
mod traces;
mod upgrade;
