//! The gateway's semantics in process: a `tower` layer around any axum
//! service, with no proxy hop.
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use idem::server::{Config, IdempotencyLayer};
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let store = idem::store::open("memory:").await?;
//! let app: Router = Router::new()
//!     .route("/orders", post(|| async { "charged once" }))
//!     .layer(IdempotencyLayer::new(Config::default(), store)?);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

use super::events::Observer;
use super::gate::{Gate, HttpResponse};
use super::{BuildError, Config};
use crate::store::{FaultHandle, Store};
use axum::body::Body;
use axum::http::Request;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service, ServiceExt};

/// Guards the wrapped service's mutating requests by their `Idempotency-Key`.
#[derive(Clone)]
pub struct IdempotencyLayer {
    gate: Arc<Gate>,
}

impl IdempotencyLayer {
    pub fn new(config: Config, store: Arc<dyn Store>) -> Result<Self, BuildError> {
        let gate = Gate::over(config, store, None, None)?;
        Ok(IdempotencyLayer {
            gate: Arc::new(gate),
        })
    }

    /// A layer over a gate that is already built (e.g. a [`super::Gateway`]'s).
    pub fn from_gate(gate: Arc<Gate>) -> Self {
        IdempotencyLayer { gate }
    }

    /// The decisions made so far.
    pub fn observer(&self) -> &Arc<Observer> {
        &self.gate.observer
    }

    /// The faults of the store the layer uses: to see how an application
    /// behaves while its store fails.
    pub fn faults(&self) -> &FaultHandle {
        self.gate.faults()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            gate: self.gate.clone(),
            inner,
        }
    }
}

#[derive(Clone)]
pub struct IdempotencyService<S> {
    gate: Arc<Gate>,
    inner: S,
}

impl<S, B> Service<Request<Body>> for IdempotencyService<S>
where
    S: Service<Request<Body>, Response = axum::http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: axum::body::HttpBody<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<HttpResponse, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Readiness is checked on the clone that serves the request.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let gate = self.gate.clone();
        let inner = self.inner.clone();
        Box::pin(async move {
            let exec = |req| async move {
                let Ok(response) = inner.oneshot(req).await;
                Ok(response.map(Body::new))
            };
            Ok(gate.handle(req, exec).await)
        })
    }
}
