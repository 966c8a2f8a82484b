//! What the idem test crates share, and nothing they would have to build
//! besides: the host's, the TUI's and the test rigs' integration tests all
//! dev-depend on it. (`idem-testkit` itself cannot be that place: it depends
//! on the host, which depends on the TUI.)
//!
//! - [`Tmux`]: a real terminal program in a tmux pane, driven by keys and
//!   read from its screen, as a person uses it;
//! - [`unique`]: keys no other test, process or run uses, for the stores a
//!   test shares with others;
//! - [`server_url`]: the URL of a test server; a test without one fails unless skipping is asked for;
//! - [`spawn_bound`]: a server process started on port 0, and the ports it
//!   says it bound; [`Proc`] kills it on drop; [`spawn_logged`] keeps its
//!   stderr lines too ([`Lines`]).
//!
//! ```
//! let a = idem_harness::unique("order");
//! assert!(a.starts_with("order-"));
//! assert_ne!(a, idem_harness::unique("order"));
//! ```

mod process;
mod tmux;

pub use process::{Lines, Proc, spawn_bound, spawn_logged};
pub use tmux::Tmux;

use std::sync::atomic::{AtomicUsize, Ordering};

/// A key no other test, process or earlier run against a shared server uses.
pub fn unique(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{name}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        fastrand::u64(..)
    )
}

/// `IDEM_TEST_DYNAMODB_URL` with a 10 s `timeout_ms` unless it names one:
/// the emulator serves one request at a time (scripts/dynamodb-server.py),
/// and the suite's cases, each with its burst of concurrent claims, queue
/// for it side by side on a loaded machine (as a test's processes do).
pub fn dynamodb_test_url() -> Option<String> {
    let url = server_url("IDEM_TEST_DYNAMODB_URL")?;
    if url.contains("timeout_ms=") {
        return Some(url);
    }
    let joiner = if url.contains('?') { '&' } else { '?' };
    Some(format!("{url}{joiner}timeout_ms=10000"))
}

/// The URL in the environment variable `var`. Without it the test fails,
/// naming the variable, unless `IDEM_TEST_SKIP_NETSTORES=1` says to skip
/// (then `None`, after saying so): a run never passes by skipping silently.
pub fn server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("IDEM_TEST_SKIP_NETSTORES").as_deref() == Ok("1") => {
            eprintln!("skipped: {var} is not set and IDEM_TEST_SKIP_NETSTORES=1");
            None
        }
        _ => panic!(
            "{var} is not set: this test needs its server (scripts/test-all.sh starts them and sets it, \
             e.g. {var}=redis://127.0.0.1:6379 or postgres://postgres@127.0.0.1:5432/test). \
             Set IDEM_TEST_SKIP_NETSTORES=1 to skip the tests that need a server on purpose."
        ),
    }
}
