//! What the gateway guards and how: methods, profile, which outcomes are
//! stored, limits. Built from flags, environment variables and an optional
//! TOML file by the binary; tests build it directly.

use std::time::Duration;

/// How errors and replays look to clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Profile {
    /// draft-ietf-httpapi-idempotency-key-header: 422 on a payload mismatch,
    /// 409 while in flight, `application/problem+json` errors.
    #[default]
    Ietf,
    /// Stripe's conventions: 400 `idempotency_error` on a mismatch, 409
    /// `idempotency_key_in_use`, errors as `{"error":{...}}`.
    Stripe,
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ietf" => Ok(Profile::Ietf),
            "stripe" => Ok(Profile::Stripe),
            other => Err(format!(
                "unknown profile {other:?}; expected ietf or stripe"
            )),
        }
    }
}

/// What a repeat does while the first request with its key is still running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InFlight {
    /// Answer 409 at once, with `Retry-After` from the remaining lease.
    Reject,
    /// Wait up to this long for the first request's response and replay it;
    /// answer 409 if it is not there by then.
    Wait(Duration),
}

impl std::str::FromStr for InFlight {
    type Err = String;
    /// `reject`, or `wait:DURATION` as [`parse_duration`] reads it (`wait:2s`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "reject" {
            return Ok(InFlight::Reject);
        }
        match s.strip_prefix("wait:") {
            Some(d) => parse_duration(d)
                .map(InFlight::Wait)
                .map_err(|e| e.to_string()),
            None => Err(format!(
                "{s:?}: expected reject or wait:DURATION (e.g. wait:2s)"
            )),
        }
    }
}

/// Which upstream outcomes are stored (and replayed) rather than releasing
/// the key for a retry. 2xx and 4xx are always stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorePolicy {
    /// Store 5xx responses too (default: release the key, so a retry runs again).
    pub server_errors: bool,
    /// Store a 504 for an upstream timeout (default: release the key).
    pub timeouts: bool,
}

/// Everything the HTTP layer of the guard needs.
#[derive(Clone, Debug)]
pub struct Config {
    pub profile: Profile,
    /// Methods guarded by the key (upper case). Others pass straight through.
    pub methods: Vec<String>,
    /// Answer 400 to a guarded request without a key (default: pass it through unguarded).
    pub require_key: bool,
    /// The header that carries the key.
    pub key_header: String,
    /// The header added to replayed responses (value `true`).
    pub replay_header: String,
    /// The header that tells when a stored response's key expires, added to
    /// the first response once it is stored and to every replay: an
    /// HTTP-date, rounded down to the second (until then a retry replays;
    /// after it, it runs again).
    pub expiry_header: String,
    /// Headers that are part of the fingerprint besides method, path and body.
    pub fingerprint_headers: Vec<String>,
    /// The header that identifies the client; keys are scoped by a hash of
    /// its value so one client never sees another's response. `None`: one scope.
    pub client_header: Option<String>,
    pub store_policy: StorePolicy,
    pub in_flight: InFlight,
    pub lease: Duration,
    pub retention: Duration,
    /// The largest request body accepted on a guarded request (413 beyond).
    pub max_request_bytes: usize,
    /// The largest upstream response stored and replayed, body plus headers.
    pub max_response_bytes: usize,
    /// The most request headers accepted (431 beyond, by the HTTP server).
    pub max_headers: usize,
    /// The largest request head accepted, in bytes.
    pub max_header_bytes: usize,
    pub upstream_timeout: Duration,
    /// How long one store call may take; past it the request fails closed (503).
    pub store_timeout: Duration,
    /// Guarded requests handled at once; more get 503 at once (load
    /// shedding). A guarded request takes its slot only once its body has
    /// arrived.
    pub max_concurrent: usize,
    /// Requests forwarded unguarded (no key under `require_key: false`, or
    /// a method not guarded) at once; more get 503 at once. Apart from
    /// `max_concurrent`, so that no number of unguarded requests — which
    /// stream their bodies, and so hold a slot while a slow client sends —
    /// can take the slots guarded requests need.
    pub max_concurrent_unguarded: usize,
    /// Client connections open at once; past it the gateway stops
    /// accepting until one closes.
    pub max_connections: usize,
    /// How long a client may take to send a request head.
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request's body, in all: a
    /// guarded body before it is claimed, an unguarded one as it streams
    /// to the upstream.
    pub body_read_timeout: Duration,
    /// The slowest a request's body may arrive, in bytes per second, after
    /// its first 2 s (408 below it); guarded and unguarded alike.
    pub min_body_rate: u64,
    /// Clients of the admin API's live event stream at once (503 beyond).
    pub max_event_listeners: usize,
    /// How often expired records are purged (stores that keep them: memory,
    /// SQLite, PostgreSQL).
    pub purge_interval: Duration,
    /// How long shutdown waits for in-flight requests.
    pub drain_timeout: Duration,
    /// Events (decisions, renewals, store errors, operators' actions) kept
    /// in memory for keys' histories (`GET /v1/keys/{key}/history`); the
    /// oldest go first. 0 keeps none.
    pub history_events: usize,
}

/// Events kept for keys' histories by default: about 2 MB.
pub const DEFAULT_HISTORY_EVENTS: usize = 10_000;
/// The most events `history-events` may keep (about 200 MB).
pub const MAX_HISTORY_EVENTS: usize = 1_000_000;

impl Default for Config {
    fn default() -> Self {
        Config {
            profile: Profile::Ietf,
            methods: vec!["POST".into(), "PATCH".into()],
            require_key: false,
            key_header: "idempotency-key".into(),
            replay_header: "idempotent-replayed".into(),
            expiry_header: "idempotency-expires".into(),
            fingerprint_headers: vec!["content-type".into()],
            client_header: Some("authorization".into()),
            store_policy: StorePolicy::default(),
            in_flight: InFlight::Reject,
            lease: Duration::from_secs(30),
            retention: Duration::from_hours(24),
            max_request_bytes: 1 << 20,
            max_response_bytes: 1 << 20,
            max_headers: 100,
            max_header_bytes: 64 << 10,
            upstream_timeout: Duration::from_secs(20),
            store_timeout: Duration::from_secs(5),
            max_concurrent: 1024,
            max_concurrent_unguarded: 1024,
            max_connections: 4096,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            min_body_rate: 1024,
            max_event_listeners: 64,
            purge_interval: Duration::from_mins(1),
            drain_timeout: Duration::from_secs(30),
            history_events: DEFAULT_HISTORY_EVENTS,
        }
    }
}

impl Config {
    /// Checks the values against each other; the error names the field and the limit.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.methods.is_empty() {
            return Err(ConfigError::NoMethods);
        }
        if self.lease.is_zero() || self.lease >= self.retention {
            return Err(ConfigError::LeaseNotUnderRetention {
                lease: self.lease,
                retention: self.retention,
            });
        }
        crate::lease::check_lease_renewable(self.lease, self.store_timeout)?;
        if self.upstream_timeout >= self.lease {
            return Err(ConfigError::UpstreamTimeoutNotUnderLease {
                upstream_timeout: self.upstream_timeout,
                lease: self.lease,
            });
        }
        if self.max_response_bytes > u32::MAX as usize {
            return Err(ConfigError::OverLimit {
                field: "max-response-bytes",
                value: self.max_response_bytes,
                limit: u32::MAX as usize,
            });
        }
        if self.max_header_bytes < MIN_HEADER_BYTES {
            return Err(ConfigError::UnderMinimum {
                field: "max-header-bytes",
                value: self.max_header_bytes,
                minimum: MIN_HEADER_BYTES,
            });
        }
        for (field, value) in [
            ("max-concurrent", self.max_concurrent),
            ("max-concurrent-unguarded", self.max_concurrent_unguarded),
            ("max-connections", self.max_connections),
            ("max-event-listeners", self.max_event_listeners),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { field });
            }
        }
        for (field, value) in [
            ("store-timeout", self.store_timeout),
            ("header-read-timeout", self.header_read_timeout),
            ("body-read-timeout", self.body_read_timeout),
            ("purge-interval", self.purge_interval),
        ] {
            if value.is_zero() {
                return Err(ConfigError::ZeroDuration { field });
            }
        }
        if self.max_response_bytes < MIN_RESPONSE_BYTES {
            return Err(ConfigError::ResponseLimitUnderMinimum {
                value: self.max_response_bytes,
            });
        }
        if self.history_events > MAX_HISTORY_EVENTS {
            return Err(ConfigError::OverLimit {
                field: "history-events",
                value: self.history_events,
                limit: MAX_HISTORY_EVENTS,
            });
        }
        if self.key_header.is_empty() || self.replay_header.is_empty() {
            return Err(ConfigError::EmptyHeaderName);
        }
        if let Err(source) = http::HeaderName::try_from(self.expiry_header.as_str()) {
            return Err(ConfigError::NotAHeaderName {
                field: "expiry-header",
                value: self.expiry_header.clone(),
                source,
            });
        }
        Ok(())
    }

    /// A guard builder with this configuration's durations and limits.
    #[cfg(feature = "engine")]
    pub fn guard_builder(&self, store: impl crate::store::Store) -> crate::GuardBuilder {
        crate::Guard::builder(store)
            .lease(self.lease)
            .retention(self.retention)
            .max_response_bytes(self.max_response_bytes as u32)
            .store_timeout(self.store_timeout)
            .purge_every(Some(self.purge_interval))
    }

    /// Whether requests with this method are guarded (any case).
    pub fn guards(&self, method: &str) -> bool {
        self.methods.iter().any(|m| m.eq_ignore_ascii_case(method))
    }
}

/// The smallest `max-response-bytes`: the problem answer stored in place of
/// a response too large to keep must fit.
pub const MIN_RESPONSE_BYTES: usize = 1024;

/// The smallest `max-header-bytes`.
pub const MIN_HEADER_BYTES: usize = 8192;

/// Why [`Config::validate`] refused a configuration: the field (named as
/// its flag is, without `--`), its value and the limit it breaks.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("methods: at least one method must be guarded")]
    NoMethods,
    #[error(
        "lease ({} ms) must be at least 1 ms and shorter than retention ({} ms)",
        .lease.as_millis(),
        .retention.as_millis()
    )]
    LeaseNotUnderRetention {
        lease: Duration,
        retention: Duration,
    },
    /// Renewals could not keep the lease alive on this store timeout.
    #[error(transparent)]
    LeaseTooShort(#[from] crate::lease::LeaseTooShort),
    #[error(
        "upstream-timeout ({} ms) must be shorter than the lease ({} ms), or a repeat could take over a request that is still running",
        .upstream_timeout.as_millis(),
        .lease.as_millis()
    )]
    UpstreamTimeoutNotUnderLease {
        upstream_timeout: Duration,
        lease: Duration,
    },
    #[error("{field} {value} is over the limit of {limit}")]
    OverLimit {
        field: &'static str,
        value: usize,
        limit: usize,
    },
    #[error("{field} {value} is under the minimum of {minimum}")]
    UnderMinimum {
        field: &'static str,
        value: usize,
        minimum: usize,
    },
    /// `max-response-bytes` under [`MIN_RESPONSE_BYTES`].
    #[error(
        "max-response-bytes {value} is under the minimum of {MIN_RESPONSE_BYTES}, which the gateway's own stored answers need"
    )]
    ResponseLimitUnderMinimum { value: usize },
    /// A count that must be at least 1.
    #[error("{field} must be at least 1")]
    Zero { field: &'static str },
    /// A duration that must be at least 1 ms.
    #[error("{field} must be at least 1 ms")]
    ZeroDuration { field: &'static str },
    #[error("key-header and replay-header must not be empty")]
    EmptyHeaderName,
    #[error("{field} {value:?} is not a header name (letters, digits and !#$%&'*+-.^_`|~)")]
    NotAHeaderName {
        field: &'static str,
        value: String,
        source: http::header::InvalidHeaderName,
    },
}

/// Parses `250ms`, `10s`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let t = text.trim();
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| DurationError::NotADuration { text: text.into() })?;
    let ms = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => {
            return Err(DurationError::UnknownUnit {
                text: text.into(),
                unit: unit.into(),
            });
        }
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| DurationError::TooLong { text: text.into() })
}

/// Why [`parse_duration`] refused a text; each says the text as given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{text:?} is not a duration; expected e.g. 250ms, 10s, 2m, 1h")]
    NotADuration { text: String },
    #[error("{text:?} has an unknown unit {unit:?}; expected ms, s, m or h")]
    UnknownUnit { text: String, unit: String },
    /// Over `u64::MAX` milliseconds.
    #[error("{text:?} is too long")]
    TooLong { text: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_mins(2)));
        let parsecs = parse_duration("10 parsecs").unwrap_err();
        assert!(
            matches!(&parsecs, DurationError::UnknownUnit { unit, .. } if unit == " parsecs"),
            "{parsecs:?}"
        );
        assert_eq!(
            parsecs.to_string(),
            "\"10 parsecs\" has an unknown unit \" parsecs\"; expected ms, s, m or h"
        );
        assert_eq!(
            parse_duration("soon"),
            Err(DurationError::NotADuration {
                text: "soon".into()
            })
        );
    }

    #[test]
    fn validation_names_the_field() {
        let refused = [
            (
                Config {
                    lease: Duration::from_secs(10),
                    retention: Duration::from_secs(5),
                    ..Config::default()
                },
                "shorter than retention",
            ),
            (
                Config {
                    upstream_timeout: Duration::from_secs(40),
                    ..Config::default()
                },
                "shorter than the lease",
            ),
        ];
        for (config, says) in refused {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(says), "{err:?} should say {says:?}");
        }
        assert!(Config::default().validate().is_ok());
    }

    #[test]
    fn a_bad_header_name_keeps_the_parse_error() {
        let config = Config {
            expiry_header: "expires at".into(),
            ..Config::default()
        };
        let err = config.validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "expiry-header \"expires at\" is not a header name (letters, digits and !#$%&'*+-.^_`|~)"
        );
        let source = std::error::Error::source(&err).expect("the header-name error");
        assert!(source.is::<http::header::InvalidHeaderName>(), "{source:?}");
    }
}
