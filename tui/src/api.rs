//! The admin API v1's wire types: the `idem-admin-api` crate, the one
//! contract the gateway serializes and this console decodes, re-exported so
//! the console's modules name them `api::…`.

pub use idem_admin_api::*;
