//! `idem serve`: an HTTP idempotency gateway in front of any service, with
//! the semantics of draft-ietf-httpapi-idempotency-key-header, and the
//! admin API on a listener of its own.
//!
//! The entry point takes its inputs, so tests bind port 0:
//!
//! ```no_run
//! use idem::server::{Config, Gateway, run};
//! # async fn demo() -> anyhow::Result<()> {
//! let store = idem::store::open("memory:").await?;
//! let gateway = Gateway::builder(Config::default(), store, "http://127.0.0.1:8081").build()?;
//! let proxy = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! run(gateway, proxy, None, async { let _ = tokio::signal::ctrl_c().await; }).await;
//! # Ok(()) }
//! ```

pub mod config;
pub mod parse;
pub mod problem;

#[cfg(feature = "engine")]
pub mod admin;
#[cfg(feature = "engine")]
pub mod events;
#[cfg(feature = "engine")]
pub mod gate;
#[cfg(feature = "engine")]
mod gateway;
#[cfg(feature = "engine")]
pub mod layer;
#[cfg(feature = "engine")]
mod poll_again;
#[cfg(feature = "engine")]
pub mod proxy;
#[cfg(feature = "engine")]
pub mod serve;
#[cfg(feature = "engine")]
pub mod traces;

pub use config::{
    Config, ConfigError, DurationError, InFlight, Profile, StorePolicy, parse_duration,
};
pub use problem::Problem;

#[cfg(feature = "engine")]
pub use admin::{AdminListener, ExposureError, MIN_TOKEN_BYTES};
#[cfg(feature = "engine")]
pub use events::{Observer, Verdict};
#[cfg(feature = "engine")]
pub use gate::Gate;
#[cfg(feature = "engine")]
pub use gateway::{BuildError, Gateway, GatewayBuilder, run};
#[cfg(feature = "engine")]
pub use layer::IdempotencyLayer;
#[cfg(feature = "engine")]
pub use proxy::{Upstream, UpstreamError};
#[cfg(feature = "engine")]
pub use traces::Traces;
