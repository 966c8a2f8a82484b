//! The `idem` command's own manners: its version, and how it reports an
//! error.

use crate::support::{IDEM, serve};
use std::process::Command;

#[test]
fn version_is_the_crates() {
    let out = Command::new(IDEM).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("idem {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn an_error_is_its_chain_of_causes_without_a_backtrace() {
    // A config file that is not there: an error with a cause.
    let out = Command::new(IDEM)
        .args(["serve", "--config", "/nonexistent/idem.toml"])
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "error: read config file /nonexistent/idem.toml: No such file or directory (os error 2)",
        "one line: what failed, then why"
    );
}

#[test]
fn a_bad_log_format_or_filter_is_refused_naming_it() {
    for (args, env, says) in [
        (
            &["--log-format", "xml"][..],
            None,
            "error: --log-format: unknown log format \"xml\"; expected text or json",
        ),
        (
            &[][..],
            Some("idem::request=loud"),
            "error: RUST_LOG=\"idem::request=loud\" is not a log filter",
        ),
    ] {
        let mut idem = serve("off");
        idem.args(["--store", "memory:", "--upstream", "http://127.0.0.1:1"])
            .args(args);
        match env {
            Some(filter) => idem.env("RUST_LOG", filter),
            None => idem.env_remove("RUST_LOG"),
        };
        let out = idem.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.starts_with(says), "{stderr}");
    }
}
