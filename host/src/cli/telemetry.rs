//! `idem serve`'s logs and traces, set up from its flags and the
//! environment: `tracing` lines on stderr (text, or JSON with
//! `--log-format json`, levels by `RUST_LOG`), and OpenTelemetry traces
//! exported over OTLP/HTTP when the standard `OTEL_*` variables ask for them.

use super::log_line::{Lines, LogLine};
use super::log_writer::{Batched, Flush};
use anyhow::{Context as _, bail};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use std::io::IsTerminal;
use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::Layer;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One line per event for people: time, level, target, message, fields
    /// (`key=value`); coloured when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message`
    /// and the event's fields beside them.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "unknown log format {other:?}; expected text or json"
            )),
        }
    }
}

/// The levels when `RUST_LOG` is unset or empty: every request's line.
const DEFAULT_FILTER: &str = "info";

/// Sends this process's `tracing` events to stderr, filtered by `RUST_LOG`
/// (default `info`). A `RUST_LOG` that does not parse is an error naming it.
/// Off a terminal the lines go through a writer thread ([`Batched`]); the
/// [`Flush`] returned writes those still pending when dropped, so hold it
/// until the process is done logging.
pub fn init_logs(format: LogFormat) -> anyhow::Result<Option<Flush>> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => EnvFilter::builder()
            .parse(&text)
            .with_context(|| format!("RUST_LOG={text:?} is not a log filter (e.g. info, warn, idem::request=info,warn)"))?,
        _ => EnvFilter::new(DEFAULT_FILTER),
    };
    // A second call in one process (the test rigs run `cli::run` more than
    // once) keeps the first subscriber: `try_init` fails, and that is fine.
    if format == LogFormat::Text && std::io::stderr().is_terminal() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(true)
            .try_init();
        Ok(None)
    } else {
        let out = Batched::new(std::io::stderr());
        let flush = out.flush_handle();
        let installed = tracing_subscriber::registry()
            .with(filter)
            .with(log_lines(format, out))
            .try_init();
        Ok(installed.is_ok().then_some(flush))
    }
}

/// `idem serve`'s log lines off a terminal (where logs are collected, and
/// a line is written per request), in `format`, as a `tracing` layer
/// writing each line to `make` with one `write_all`: the very same lines
/// as `tracing-subscriber`'s formatters (uncoloured), at a fraction of the
/// cost. On a terminal `idem serve` colours its text with
/// `tracing-subscriber`'s own. `idem serve` writes to stderr through a
/// [`Batched`] writer; the gateway bench puts a filter of its own in front
/// and writes to a file the same way.
pub fn log_lines<S, W>(format: LogFormat, make: W) -> impl Layer<S>
where
    S: Subscriber,
    W: for<'w> MakeWriter<'w> + 'static,
{
    let format = match format {
        LogFormat::Text => LogLine::Text,
        LogFormat::Json => LogLine::Json,
    };
    Lines { format, make }
}

/// The OTLP trace exporter `idem serve` runs, and where it sends.
pub struct OtlpTraces {
    provider: SdkTracerProvider,
    /// The URL spans are POSTed to.
    pub endpoint: String,
}

impl OtlpTraces {
    pub fn tracer(&self) -> SdkTracer {
        self.provider.tracer("idem")
    }

    /// Exports the spans still queued, then stops the exporter's thread.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(target: "idem::traces", error = %e, "the trace exporter did not shut down cleanly");
        }
    }
}

/// A variable's value, `None` when unset or empty.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The trace exporter the standard variables ask for, or `None` (traces off):
///
/// - `OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER=none`: off;
/// - `OTEL_TRACES_EXPORTER=otlp`, or an endpoint in
///   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`:
///   on (the endpoint defaults to `http://localhost:4318/v1/traces`);
/// - neither: off (unlike the specification's default, traces are opt-in).
///
/// Only OTLP over HTTP with protobuf (`OTEL_EXPORTER_OTLP_PROTOCOL`
/// unset or `http/protobuf`) to an `http://` endpoint is supported; any
/// other exporter, protocol or scheme is an error naming it.
pub fn traces_from_env() -> anyhow::Result<Option<OtlpTraces>> {
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let traces_endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let endpoint = var("OTEL_EXPORTER_OTLP_ENDPOINT");
    match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
        None if traces_endpoint.is_none() && endpoint.is_none() => return Ok(None),
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => bail!(
            "OTEL_TRACES_EXPORTER={other:?} is not supported: idem exports traces with otlp (or none)"
        ),
    }
    let protocol =
        var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"));
    if let Some(protocol) = protocol.filter(|p| p != "http/protobuf") {
        bail!(
            "OTLP protocol {protocol:?} is not supported: idem exports http/protobuf (set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf or leave it unset)"
        );
    }
    let url = match (traces_endpoint, endpoint) {
        (Some(url), _) => url,
        (None, Some(base)) => format!("{}/v1/traces", base.trim_end_matches('/')),
        (None, None) => "http://localhost:4318/v1/traces".to_owned(),
    };
    if !url.starts_with("http://") {
        bail!(
            "OTLP endpoint {url:?}: only http:// is supported (no TLS stack is built in); send to a collector or agent beside the gateway"
        );
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .with_context(|| format!("the OTLP trace exporter for {url}"))?;
    let mut resource = Resource::builder();
    let named = var("OTEL_SERVICE_NAME").is_some()
        || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| a.contains("service.name="));
    if !named {
        resource = resource.with_service_name("idem");
    }
    let resource = resource
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    Ok(Some(OtlpTraces {
        provider,
        endpoint: url,
    }))
}
