//! `idem serve` options: flags, environment variables (`IDEM_*`) and an
//! optional TOML file with the same names (`lease = "30s"`), in that order
//! of precedence.

use super::telemetry::{self, LogFormat};
use crate::server::{Config, InFlight, Profile, StorePolicy, parse_duration};
use anyhow::{Context, bail};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(clap::Args, Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ServeOptions {
    /// A TOML file with any of these options (flags and environment variables win).
    #[arg(long, env = "IDEM_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Where the gateway listens [default: 127.0.0.1:8080]; port 0 takes a free one, printed at start.
    #[arg(long, env = "IDEM_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// The service behind the gateway, http://HOST:PORT[/PREFIX].
    #[arg(long, env = "IDEM_UPSTREAM", value_name = "URL")]
    pub upstream: Option<String>,
    /// Where records live: memory:, sqlite:PATH, redis://…, postgres://…, dynamodb://… [default: sqlite:idem.db].
    #[arg(long, env = "IDEM_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// Where the admin API listens [default: 127.0.0.1:9090]; `off` for none; port 0 as for --listen.
    #[arg(long, env = "IDEM_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// The admin API's bearer token; required off loopback, then at least 16 bytes. On the command line it shows in `ps`: prefer IDEM_ADMIN_TOKEN or --admin-token-file.
    #[arg(
        long,
        env = "IDEM_ADMIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// A file holding the admin API's bearer token (one trailing newline is dropped); not with --admin-token.
    #[arg(long, env = "IDEM_ADMIN_TOKEN_FILE", value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// ietf (422 on mismatch, problem+json) or stripe [default: ietf].
    #[arg(long, env = "IDEM_PROFILE")]
    pub profile: Option<String>,
    /// Methods guarded by the key, comma-separated [default: POST,PATCH].
    #[arg(long, env = "IDEM_METHODS", value_delimiter = ',')]
    pub methods: Option<Vec<String>>,
    /// Answer 400 to a guarded request without a key (default: forward it unguarded).
    #[arg(long, env = "IDEM_REQUIRE_KEY")]
    pub require_key: Option<bool>,
    /// Headers that are part of the fingerprint, comma-separated [default: content-type].
    #[arg(long, env = "IDEM_FINGERPRINT_HEADERS", value_delimiter = ',')]
    pub fingerprint_headers: Option<Vec<String>>,
    /// The header identifying the client; keys are scoped by its hash [default: authorization; "" for one scope].
    #[arg(long, env = "IDEM_CLIENT_HEADER")]
    pub client_header: Option<String>,
    /// Store 5xx responses instead of releasing the key [default: false].
    #[arg(long, env = "IDEM_STORE_5XX")]
    pub store_5xx: Option<bool>,
    /// Store a 504 for upstream timeouts instead of releasing the key [default: false].
    #[arg(long, env = "IDEM_STORE_TIMEOUTS")]
    pub store_timeouts: Option<bool>,
    /// `reject` (409 at once) or `wait:DURATION` (wait that long for the first response) [default: reject].
    #[arg(long, env = "IDEM_IN_FLIGHT")]
    pub in_flight: Option<String>,
    /// How long a claim is held before a repeat may take it over [default: 30s].
    #[arg(long, env = "IDEM_LEASE")]
    pub lease: Option<String>,
    /// How long responses are kept for replay [default: 24h].
    #[arg(long, env = "IDEM_RETENTION")]
    pub retention: Option<String>,
    /// The largest request body on a guarded request [default: 1048576].
    #[arg(long, env = "IDEM_MAX_REQUEST_BYTES")]
    pub max_request_bytes: Option<usize>,
    /// The largest upstream response stored [default: 1048576].
    #[arg(long, env = "IDEM_MAX_RESPONSE_BYTES")]
    pub max_response_bytes: Option<usize>,
    /// The most request headers [default: 100].
    #[arg(long, env = "IDEM_MAX_HEADERS")]
    pub max_headers: Option<usize>,
    /// The largest request head in bytes [default: 65536].
    #[arg(long, env = "IDEM_MAX_HEADER_BYTES")]
    pub max_header_bytes: Option<usize>,
    /// How long the upstream may take; shorter than the lease [default: 20s].
    #[arg(long, env = "IDEM_UPSTREAM_TIMEOUT")]
    pub upstream_timeout: Option<String>,
    /// How long one store call may take; past it the request is answered 503 [default: 5s].
    #[arg(long, env = "IDEM_STORE_TIMEOUT")]
    pub store_timeout: Option<String>,
    /// Guarded requests handled at once; more get 503 [default: 1024].
    #[arg(long, env = "IDEM_MAX_CONCURRENT")]
    pub max_concurrent: Option<usize>,
    /// Requests forwarded unguarded (no key, or a method not guarded) at once, apart from --max-concurrent; more get 503 [default: 1024].
    #[arg(long, env = "IDEM_MAX_CONCURRENT_UNGUARDED")]
    pub max_concurrent_unguarded: Option<usize>,
    /// Client connections open at once; more wait to be accepted [default: 4096].
    #[arg(long, env = "IDEM_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// How long a client may take to send a request head [default: 10s].
    #[arg(long, env = "IDEM_HEADER_READ_TIMEOUT")]
    pub header_read_timeout: Option<String>,
    /// How long a client may take to send a request body, guarded or forwarded unguarded [default: 30s].
    #[arg(long, env = "IDEM_BODY_READ_TIMEOUT")]
    pub body_read_timeout: Option<String>,
    /// The slowest a request body may arrive after its first 2 s, in bytes/s; slower gets 408 [default: 1024].
    #[arg(long, env = "IDEM_MIN_BODY_RATE")]
    pub min_body_rate: Option<u64>,
    /// Clients of the admin API's /v1/events stream at once [default: 64].
    #[arg(long, env = "IDEM_MAX_EVENT_LISTENERS")]
    pub max_event_listeners: Option<usize>,
    /// How often expired records are purged (memory, SQLite, PostgreSQL) [default: 60s].
    #[arg(long, env = "IDEM_PURGE_INTERVAL")]
    pub purge_interval: Option<String>,
    /// How long shutdown waits for in-flight requests [default: 30s].
    #[arg(long, env = "IDEM_DRAIN_TIMEOUT")]
    pub drain_timeout: Option<String>,
    /// Events kept in memory for keys' histories (the console's `h`) [default: 10000; 0 for none].
    #[arg(long, env = "IDEM_HISTORY_EVENTS")]
    pub history_events: Option<usize>,
    /// What the admin API and the console call this gateway [default: its proxy's address].
    #[arg(long, env = "IDEM_NAME", value_name = "NAME")]
    pub name: Option<String>,
    /// Log lines on stderr as `text` or `json`, one per line; levels by RUST_LOG [default: text, RUST_LOG=info].
    #[arg(long, env = "IDEM_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<String>,
}

/// What `idem serve` runs.
pub struct Serve {
    pub listen: String,
    pub upstream: String,
    pub store: String,
    pub admin_listen: Option<String>,
    pub admin_token: Option<String>,
    pub name: String,
    pub log_format: LogFormat,
    pub config: Config,
}

macro_rules! merge {
    ($cli:ident, $file:ident, $($field:ident),*) => {
        $( if $cli.$field.is_none() { $cli.$field = $file.$field.take(); } )*
    };
}

impl ServeOptions {
    #[allow(clippy::too_many_lines)] // one line per option
    pub fn resolve(mut self) -> anyhow::Result<Serve> {
        if let Some(path) = &self.config {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("read config file {}", path.display()))?;
            let mut file: ServeOptions =
                toml::from_str(&text).with_context(|| format!("config file {}", path.display()))?;
            merge!(
                self,
                file,
                listen,
                upstream,
                store,
                admin_listen,
                admin_token,
                admin_token_file,
                profile,
                methods,
                require_key,
                fingerprint_headers,
                client_header,
                store_5xx,
                store_timeouts,
                in_flight,
                lease,
                retention,
                max_request_bytes,
                max_response_bytes,
                max_headers,
                max_header_bytes,
                upstream_timeout,
                store_timeout,
                max_concurrent,
                max_concurrent_unguarded,
                max_connections,
                header_read_timeout,
                body_read_timeout,
                min_body_rate,
                max_event_listeners,
                purge_interval,
                drain_timeout,
                history_events,
                name,
                log_format
            );
        }
        let d = Config::default();
        let duration = |name: &str, value: Option<String>, default| -> anyhow::Result<_> {
            value.map_or(Ok(default), |v| {
                parse_duration(&v).map_err(|e| anyhow::anyhow!("--{name}: {e}"))
            })
        };
        let in_flight = match self.in_flight.as_deref() {
            None => InFlight::Reject,
            Some(w) => w.parse().map_err(|e| anyhow::anyhow!("--in-flight: {e}"))?,
        };
        let config = Config {
            profile: self
                .profile
                .as_deref()
                .map_or(Ok(Profile::Ietf), str::parse)
                .map_err(|e| anyhow::anyhow!("--profile: {e}"))?,
            methods: self.methods.map_or(d.methods, |m| {
                m.iter().map(|m| m.trim().to_ascii_uppercase()).collect()
            }),
            require_key: self.require_key.unwrap_or(d.require_key),
            fingerprint_headers: self.fingerprint_headers.map_or(d.fingerprint_headers, |h| {
                h.iter()
                    .map(|h| h.trim().to_ascii_lowercase())
                    .filter(|h| !h.is_empty())
                    .collect()
            }),
            client_header: match self.client_header {
                None => d.client_header,
                Some(h) if h.is_empty() => None,
                Some(h) => Some(h.to_ascii_lowercase()),
            },
            store_policy: StorePolicy {
                server_errors: self.store_5xx.unwrap_or(false),
                timeouts: self.store_timeouts.unwrap_or(false),
            },
            in_flight,
            lease: duration("lease", self.lease, d.lease)?,
            retention: duration("retention", self.retention, d.retention)?,
            max_request_bytes: self.max_request_bytes.unwrap_or(d.max_request_bytes),
            max_response_bytes: self.max_response_bytes.unwrap_or(d.max_response_bytes),
            max_headers: self.max_headers.unwrap_or(d.max_headers),
            max_header_bytes: self.max_header_bytes.unwrap_or(d.max_header_bytes),
            upstream_timeout: duration(
                "upstream-timeout",
                self.upstream_timeout,
                d.upstream_timeout,
            )?,
            store_timeout: duration("store-timeout", self.store_timeout, d.store_timeout)?,
            max_concurrent: self.max_concurrent.unwrap_or(d.max_concurrent),
            max_concurrent_unguarded: self
                .max_concurrent_unguarded
                .unwrap_or(d.max_concurrent_unguarded),
            max_connections: self.max_connections.unwrap_or(d.max_connections),
            header_read_timeout: duration(
                "header-read-timeout",
                self.header_read_timeout,
                d.header_read_timeout,
            )?,
            body_read_timeout: duration(
                "body-read-timeout",
                self.body_read_timeout,
                d.body_read_timeout,
            )?,
            min_body_rate: self.min_body_rate.unwrap_or(d.min_body_rate),
            max_event_listeners: self.max_event_listeners.unwrap_or(d.max_event_listeners),
            purge_interval: duration("purge-interval", self.purge_interval, d.purge_interval)?,
            drain_timeout: duration("drain-timeout", self.drain_timeout, d.drain_timeout)?,
            history_events: self.history_events.unwrap_or(d.history_events),
            ..d
        };
        let log_format = match self.log_format.as_deref() {
            None => LogFormat::Text,
            Some(f) => f
                .parse()
                .map_err(|e| anyhow::anyhow!("--log-format: {e}"))?,
        };
        config.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        let Some(upstream) = self.upstream else {
            bail!(
                "--upstream is required (or IDEM_UPSTREAM, or upstream = \"http://…\" in the config file)"
            );
        };
        let admin_token = match (self.admin_token, self.admin_token_file) {
            (Some(_), Some(file)) => bail!(
                "--admin-token (or IDEM_ADMIN_TOKEN) and --admin-token-file (or IDEM_ADMIN_TOKEN_FILE, here {}) both give the admin token; give one",
                file.display()
            ),
            (token, None) => token,
            (None, Some(file)) => Some(read_token_file(&file)?),
        };
        Ok(Serve {
            listen: self.listen.unwrap_or_else(|| "127.0.0.1:8080".into()),
            upstream,
            store: self.store.unwrap_or_else(|| "sqlite:idem.db".into()),
            admin_listen: match self.admin_listen.as_deref() {
                Some("off") => None,
                Some(a) => Some(a.to_owned()),
                None => Some("127.0.0.1:9090".into()),
            },
            admin_token,
            name: self.name.unwrap_or_default(),
            log_format,
            config,
        })
    }
}

/// The admin token in `file`: its text less one trailing newline, as
/// `echo TOKEN > file` and editors leave it.
pub(crate) fn read_token_file(file: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("read the admin token file {}", file.display()))?;
    Ok(idem_admin_api::token_from_file(&text).to_owned())
}

/// Runs the gateway until Ctrl-C or SIGTERM.
pub async fn serve(options: ServeOptions) -> anyhow::Result<()> {
    let serve = options.resolve()?;
    // Held to the end: dropped, it writes the log lines still pending.
    let logs = telemetry::init_logs(serve.log_format)?;
    let traces = telemetry::traces_from_env()?;
    raise_file_limit(serve.config.max_connections);
    // Listening first, the admin token checked with its listener: a bad one
    // stops the gateway before anything else, and clients wait in the
    // backlog (not refused) while the store is tried and the component built.
    let proxy = tokio::net::TcpListener::bind(&serve.listen)
        .await
        .with_context(|| format!("listen on {}", serve.listen))?;
    let admin = match &serve.admin_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("admin listen on {addr}"))?;
            Some(crate::server::AdminListener::new(
                listener,
                serve.admin_token.clone(),
            )?)
        }
        None => None,
    };
    // The store is opened in the background: the gateway serves whatever
    // its state, answering 503 until it is open.
    let (store, connection) = crate::store::connect(&serve.store)?;
    first_attempt(&connection, serve.config.store_timeout).await?;
    let mut builder = crate::server::Gateway::builder(serve.config, store, &serve.upstream)
        .store_connection(connection.clone())
        .name(serve.name.clone());
    if let Some(traces) = &traces {
        builder = builder.tracer(traces.tracer());
    }
    let gateway = builder.build()?;
    let listening = proxy.local_addr()?;
    if serve.store.starts_with("memory:") && !listening.ip().is_loopback() {
        eprintln!(
            "idem serve: warning: the memory store keeps keys in this process only, and the gateway listens on {listening}, where others can reach it: a restart forgets every key, so a retry after it runs its request again; use --store sqlite:FILE, redis://… or postgres://… to keep them"
        );
    }
    // The bound addresses, so `--listen 127.0.0.1:0` (any free port) can be found.
    eprintln!(
        "idem serve: http://{listening} -> {} (store {})",
        serve.upstream, serve.store
    );
    if let Some(admin) = &admin {
        eprintln!(
            "admin API: http://{}/v1/stats",
            admin.listener.local_addr()?
        );
    }
    let reporting = tokio::spawn(report_connection(connection));
    if let Some(traces) = &traces {
        tracing::info!(target: "idem::traces", endpoint = %traces.endpoint, "exporting traces over OTLP/HTTP");
    }
    crate::server::run(gateway, proxy, admin, shutdown_signal()).await;
    reporting.abort();
    if let Some(traces) = traces {
        // Flushing blocks on the exporter's thread: not on a runtime worker.
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    // Every request's line before the last one.
    drop(logs);
    eprintln!("idem serve: stopped");
    Ok(())
}

/// Waits for the first attempt to open the store, at most `bound`: a URL
/// the store refuses stops the gateway there; a store that cannot be
/// reached now is said on stderr, and the gateway serves all the same.
async fn first_attempt(
    connection: &crate::store::Connection,
    bound: std::time::Duration,
) -> anyhow::Result<()> {
    let mut changes = connection.subscribe();
    let _ = tokio::time::timeout(bound, changes.wait_for(|c| c.attempts > 0)).await;
    if let Some(refused) = connection.refused() {
        bail!("{refused}");
    }
    Ok(())
}

/// Says on stderr when the store cannot be opened (once per distinct
/// error), and when it is.
async fn report_connection(connection: crate::store::Connection) {
    use idem_admin_api::ConnectionState;
    let mut changes = connection.subscribe();
    let mut said: Option<String> = None;
    loop {
        let now = changes.borrow_and_update().clone();
        if now.state == ConnectionState::Connected {
            if now.attempts > 1 {
                eprintln!(
                    "idem serve: store connected at attempt {}; guarded requests reach it again",
                    now.attempts
                );
            }
            return;
        }
        if let Some(error) = now.last_error.filter(|e| said.as_ref() != Some(e)) {
            eprintln!(
                "idem serve: warning: the store is not connected ({} attempts): {error}; guarded requests get 503 with Retry-After until it is, trying again every {}–{} ms",
                now.attempts,
                crate::store::FIRST_RETRY.as_millis() / 2,
                crate::store::LAST_RETRY.as_millis()
            );
            said = Some(error);
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// Raises the soft limit on open files to the hard one, so that
/// `max-connections` clients (and as many upstream connections) can be
/// open at once; warns if even the hard limit is too low for that.
fn raise_file_limit(max_connections: usize) {
    // Each client connection may pair with an upstream one; 64 for the rest.
    let wanted = (max_connections as u64)
        .saturating_mul(2)
        .saturating_add(64);
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < wanted => eprintln!(
            "idem serve: warning: the open-file limit is {limit}, under the {wanted} that --max-connections {max_connections} may need; raise it (ulimit -n) or lower --max-connections"
        ),
        Ok(_) => {}
        Err(e) => eprintln!("idem serve: warning: could not raise the open-file limit: {e}"),
    }
}

/// Ctrl-C, or SIGTERM on Unix.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn flags_win_over_the_file_and_bad_values_are_named() {
        let dir = std::env::temp_dir().join(format!("idem-options-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("idem.toml");
        std::fs::write(&file, "upstream = \"http://127.0.0.1:1\"\nlease = \"5s\"\nprofile = \"stripe\"\nin-flight = \"wait:2s\"\n").unwrap();
        let serve = ServeOptions {
            config: Some(file.clone()),
            lease: Some("7s".into()),
            upstream_timeout: Some("3s".into()),
            store_timeout: Some("3s".into()),
            ..ServeOptions::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(serve.config.lease, Duration::from_secs(7));
        assert_eq!(serve.config.profile, Profile::Stripe);
        assert_eq!(
            serve.config.in_flight,
            InFlight::Wait(Duration::from_secs(2))
        );
        assert_eq!(serve.upstream, "http://127.0.0.1:1");

        std::fs::write(&file, "upstream = \"http://x\"\nleese = \"5s\"\n").unwrap();
        let err = format!(
            "{:#}",
            ServeOptions {
                config: Some(file),
                ..ServeOptions::default()
            }
            .resolve()
            .err()
            .unwrap()
        );
        assert!(err.contains("leese"), "{err}");
        let err = ServeOptions {
            upstream: Some("http://x".into()),
            lease: Some("forever".into()),
            ..ServeOptions::default()
        }
        .resolve()
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("--lease"), "{err}");
        assert!(
            ServeOptions::default()
                .resolve()
                .err()
                .unwrap()
                .to_string()
                .contains("--upstream is required")
        );
    }
}
