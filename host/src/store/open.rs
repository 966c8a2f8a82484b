//! Choosing a store by URL: `memory:`, `sqlite:PATH`, `redis://…`,
//! `redis+cluster://…`, `postgres://…`, `dynamodb://…` (feature `dynamodb`).

use super::{MemoryStore, Store};
#[cfg(feature = "sqlite")]
use super::{SqliteOptions, SqliteStore, Synchronous};
use std::sync::Arc;

/// Why a store could not be opened. Names the store and the URL's problem.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "store URL {url:?} is not understood: {reason}; expected memory:, sqlite:PATH, redis://HOST[:PORT][/DB], redis+cluster://HOST:PORT[,HOST:PORT…], postgres://USER@HOST[:PORT]/DB or dynamodb://HOST:PORT?table=T"
    )]
    BadUrl { url: String, reason: String },
    #[error("{store} store at {url:?} could not be opened: {reason}")]
    Unreachable {
        store: &'static str,
        url: String,
        reason: String,
    },
    /// The URL names a store whose cargo feature this build of idem lacks.
    /// Names the scheme, not the URL, which may hold a password.
    #[error(
        "a {scheme}: store URL needs idem built with the `{feature}` feature (this build has: {built})"
    )]
    NotBuilt {
        scheme: String,
        feature: &'static str,
        built: String,
    },
}

/// The stores this build can open: `memory` and the store features on.
const BUILT_IN: &[&str] = &[
    "memory",
    #[cfg(feature = "sqlite")]
    "sqlite",
    #[cfg(feature = "redis")]
    "redis",
    #[cfg(feature = "postgres")]
    "postgres",
    #[cfg(feature = "dynamodb")]
    "dynamodb",
];

/// The name of the store a URL names (`memory`, `sqlite`, `redis`,
/// `postgres`, `dynamodb`: [`Store::name`]), from its scheme alone, without
/// opening it, whether or not this build has that store.
pub fn store_name(url: &str) -> Result<&'static str, OpenError> {
    let bad = |reason: String| OpenError::BadUrl {
        url: url.to_owned(),
        reason,
    };
    let (scheme, _) = url
        .split_once(':')
        .ok_or_else(|| bad("it has no scheme".into()))?;
    match scheme {
        "memory" => Ok("memory"),
        "sqlite" => Ok("sqlite"),
        "redis" | "redis+cluster" => Ok("redis"),
        "postgres" | "postgresql" => Ok("postgres"),
        "dynamodb" | "dynamodb+https" => Ok("dynamodb"),
        other => Err(bad(format!("unknown store {other:?}"))),
    }
}

/// Opens the store a URL names. Each store but `memory` is built only with
/// the cargo feature of its name (`Cargo.toml`): a URL for a store left out
/// is refused with [`OpenError::NotBuilt`].
pub async fn open(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    match store_name(url)? {
        "memory" => Ok(Arc::new(MemoryStore::new())),
        #[cfg(feature = "sqlite")]
        "sqlite" => open_sqlite(url).await,
        #[cfg(feature = "redis")]
        "redis" => Ok(Arc::new(super::RedisStore::open(url).await?)),
        #[cfg(feature = "postgres")]
        "postgres" => Ok(Arc::new(super::PostgresStore::open(url).await?)),
        #[cfg(feature = "dynamodb")]
        "dynamodb" => Ok(Arc::new(super::DynamoDbStore::open(url).await?)),
        feature => Err(OpenError::NotBuilt {
            scheme: url
                .split_once(':')
                .map_or(url, |(scheme, _)| scheme)
                .to_owned(),
            feature,
            built: BUILT_IN.join(", "),
        }),
    }
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(url: &str) -> Result<Arc<dyn Store>, OpenError> {
    let rest = url.split_once(':').map_or("", |(_, rest)| rest);
    let (path, options) = sqlite_url(url, rest)?;
    let opened = tokio::task::spawn_blocking(move || SqliteStore::open(path, options)).await;
    let store = opened.map_err(|e| OpenError::Unreachable {
        store: "sqlite",
        url: url.to_owned(),
        reason: e.to_string(),
    })??;
    Ok(Arc::new(store))
}

/// The longest `busy_timeout_ms` a SQLite URL may give: ten minutes.
#[cfg(feature = "sqlite")]
const MAX_BUSY_TIMEOUT_MS: u64 = 600_000;

/// `sqlite:PATH`, `sqlite://PATH` (so `sqlite:///abs/path` works too), with
/// an optional `?synchronous=normal|full` and `&busy_timeout_ms=N` (how
/// long a write waits for another process's write lock; default 5000).
#[cfg(feature = "sqlite")]
fn sqlite_url(url: &str, rest: &str) -> Result<(std::path::PathBuf, SqliteOptions), OpenError> {
    let bad = |reason: String| OpenError::BadUrl {
        url: url.to_owned(),
        reason,
    };
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() {
        return Err(bad("sqlite: needs a file path, as in sqlite:idem.db".into()));
    }
    let mut options = SqliteOptions::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("synchronous", value)) => {
                options.synchronous = Synchronous::parse(value).ok_or_else(|| {
                    bad(format!("synchronous={value:?} is not one of normal, full"))
                })?;
            }
            Some(("busy_timeout_ms", value)) => {
                let ms = value
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| *ms <= MAX_BUSY_TIMEOUT_MS)
                    .ok_or_else(|| {
                        bad(format!(
                            "busy_timeout_ms={value:?} must be a whole number from 0 to {MAX_BUSY_TIMEOUT_MS}"
                        ))
                    })?;
                options.busy_timeout = std::time::Duration::from_millis(ms);
            }
            _ => {
                return Err(bad(format!(
                    "unknown sqlite option {pair:?}; the options are synchronous=normal|full and busy_timeout_ms=N"
                )));
            }
        }
    }
    Ok((path.into(), options))
}

#[cfg(test)]
mod tests {
    /// A URL for a store this build left out names the feature to turn on,
    /// and not the URL, which may hold a password. `cargo test` builds every
    /// store; scripts/check-features.sh runs this with none.
    #[cfg(not(feature = "redis"))]
    #[tokio::test]
    async fn a_store_left_out_names_its_feature() {
        let Err(err) = super::open("redis+cluster://:hunter2@node-1:7000").await else {
            panic!("opened a Redis store without the redis feature");
        };
        let message = err.to_string();
        assert!(
            message.starts_with(
                "a redis+cluster: store URL needs idem built with the `redis` feature (this build has: memory"
            ),
            "{message}"
        );
        assert!(!message.contains("hunter2"), "{message}");
    }
}
