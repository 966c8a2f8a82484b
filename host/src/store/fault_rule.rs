//! The fault rules of [`super::Faulty`] and their one text form, after
//! fail-rs: `[P%][N*]KIND[(ARG)]`. They are part of the admin API's contract
//! (`PUT /v1/faults`, the console's faults view), so they live in the
//! `idem-admin-api` crate; the store decorator uses them from there.
//!
//! ```
//! use idem::store::{FaultRule, FaultKind};
//! let rule: FaultRule = "25%3*error(connection refused)".parse().unwrap();
//! assert_eq!(rule.kind, FaultKind::Error);
//! assert_eq!(rule.to_string(), "25%3*error(connection refused)");
//! ```

pub use idem_admin_api::{FaultKind, FaultRule, Op, ParseFaultError};
