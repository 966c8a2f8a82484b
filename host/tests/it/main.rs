//! The host's integration tests, one binary to keep link times down.

mod conformance;
mod engine;
mod gateway;
mod guard;
mod model;
mod multiprocess;
mod netstores;
mod proxy;
mod sandbox;
mod scenarios;
mod seed;
mod sqlite;
