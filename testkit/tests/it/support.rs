//! What the tests share: the `idem-testkit` binary, and the harness's unique
//! keys and network stores' URLs.

pub use idem_harness::{dynamodb_test_url, server_url, unique};

/// Cargo builds the package's binary for its tests and names it here.
pub const TESTKIT: &str = env!("CARGO_BIN_EXE_idem-testkit");
