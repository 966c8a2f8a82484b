//! Forwarding to the upstream over HTTP/1.1, with pooled connections.

use super::gate::{HttpResponse, strip_hop_by_hop};
use super::problem::Problem;
use axum::body::Body;
use axum::http::{HeaderValue, Request, Uri, Version, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The service the gateway guards.
#[derive(Clone)]
pub struct Upstream {
    client: Client<HttpConnector, Body>,
    /// `http://host:port` plus an optional path prefix, without a trailing `/`.
    base: String,
    host: HeaderValue,
}

/// Why [`Upstream::new`] refused a URL. Each names the URL; a parse
/// error is the [`source`](std::error::Error::source), not repeated in the
/// message (`{:#}` of an `anyhow::Error` shows both, as `idem serve` does).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream URL {url:?} does not parse")]
    Unparsable {
        url: String,
        source: axum::http::uri::InvalidUri,
    },
    #[error(
        "upstream URL {url:?}: scheme {scheme:?} is not supported; the gateway speaks plain HTTP to an upstream beside it (use http://)"
    )]
    Scheme { url: String, scheme: String },
    #[error("upstream URL {url:?} has no scheme; expected http://HOST:PORT")]
    NoScheme { url: String },
    #[error("upstream URL {url:?} has no host")]
    NoHost { url: String },
    /// The URL's authority is not a `Host` header value.
    #[error("upstream host")]
    Host {
        source: axum::http::header::InvalidHeaderValue,
    },
}

impl Upstream {
    /// An upstream at `url` (`http://HOST:PORT[/PREFIX]`).
    pub fn new(url: &str) -> Result<Upstream, UpstreamError> {
        let uri: Uri = url.parse().map_err(|source| UpstreamError::Unparsable {
            url: url.into(),
            source,
        })?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(UpstreamError::Scheme {
                    url: url.into(),
                    scheme: other.into(),
                });
            }
            None => return Err(UpstreamError::NoScheme { url: url.into() }),
        }
        let authority = uri
            .authority()
            .ok_or_else(|| UpstreamError::NoHost { url: url.into() })?
            .clone();
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|source| UpstreamError::Host { source })?;
        let prefix = uri.path().trim_end_matches('/');
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(512)
            .build(connector);
        Ok(Upstream {
            client,
            base: format!("http://{authority}{prefix}"),
            host,
        })
    }

    /// Sends `req` upstream as a reverse proxy does: hop-by-hop headers
    /// dropped, `Host` set to the upstream's.
    pub async fn forward(&self, req: Request<Body>) -> Result<HttpResponse, Problem> {
        let (mut parts, body) = req.into_parts();
        let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
        if !path.starts_with('/') {
            // `OPTIONS *` (asterisk form) asks about the server, not a
            // resource; appended to the upstream's base it would name
            // another host. The gateway does not forward it.
            return Err(Problem::BadRequest(format!(
                "request target {path:?} is not a path; the gateway forwards only origin-form targets (/…)"
            )));
        }
        parts.uri = format!("{}{path}", self.base).parse().map_err(|e| {
            Problem::BadRequest(format!(
                "the request path does not make an upstream URL: {e}"
            ))
        })?;
        parts.version = Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.insert(header::HOST, self.host.clone());
        let response = self
            .client
            .request(Request::from_parts(parts, body))
            .await
            .map_err(|e| Problem::UpstreamFailed(error_chain(&e)))?;
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Ok(HttpResponse::from_parts(parts, Body::new(body)))
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
