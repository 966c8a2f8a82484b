//! The host's integration tests, one binary to keep link times down.

mod conformance;
mod engine;
mod guard;
mod model;
mod sandbox;
mod seed;
