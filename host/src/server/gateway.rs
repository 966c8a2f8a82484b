//! The gateway: the guard over one store, in front of one upstream, with
//! the admin API's state; and [`run`], which serves it.

use super::gate::Gate;
use super::{AdminListener, Config, Observer, Upstream, admin, serve};
use crate::clock::Clock;
use crate::guard::Guard;
use crate::store::{Connection, FaultHandle, Store};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use opentelemetry_sdk::trace::SdkTracer;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Why a gateway could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("invalid configuration")]
    Config(#[from] super::ConfigError),
    #[error(transparent)]
    Upstream(#[from] super::UpstreamError),
    #[error("the guard could not be built: {0}")]
    Guard(#[from] idem_guest::model::GuardError),
}

/// A gateway: the guard over one store, an upstream, the admin state.
/// Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    gate: Arc<Gate>,
    /// Shared: the proxy's handler gets a clone of the gateway per request.
    upstream: Arc<Upstream>,
    connection: Connection,
}

pub struct GatewayBuilder {
    config: Config,
    store: Arc<dyn Store>,
    upstream: String,
    clock: Option<Arc<dyn Clock>>,
    connection: Connection,
    tracer: Option<SdkTracer>,
    name: String,
}

impl GatewayBuilder {
    /// Whether the store is open yet, for the admin API: the
    /// [`Connection`] of a store from [`crate::store::connect`] (default: a
    /// store open already).
    #[must_use]
    pub fn store_connection(mut self, connection: Connection) -> Self {
        self.connection = connection;
        self
    }

    /// The clock the guard sees (default: the store's time authority,
    /// [`Store::clock`]).
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Traces every guarded request with `tracer` (see
    /// [`super::traces`]; default: no traces, at no cost).
    #[must_use]
    pub fn tracer(mut self, tracer: SdkTracer) -> Self {
        self.tracer = Some(tracer);
        self
    }

    /// What the admin API and the console call this gateway (default: its
    /// proxy's address).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    pub fn build(self) -> Result<Gateway, BuildError> {
        self.config.validate()?;
        let upstream = Upstream::new(&self.upstream)?;
        let gate = Gate::over(self.config, self.store, self.clock, self.tracer)?;
        gate.observer.set_name(&self.name);
        Ok(Gateway {
            gate: Arc::new(gate),
            upstream: Arc::new(upstream),
            connection: self.connection,
        })
    }
}

impl Gateway {
    /// A gateway over `store` (in the [`crate::store::Stack`], whose faults
    /// the admin API drives) in front of the upstream at `upstream`.
    pub fn builder(config: Config, store: Arc<dyn Store>, upstream: &str) -> GatewayBuilder {
        GatewayBuilder {
            config,
            store,
            upstream: upstream.to_owned(),
            clock: None,
            connection: Connection::connected(),
            tracer: None,
            name: String::new(),
        }
    }

    /// Whether the store is open yet.
    pub fn store_connection(&self) -> &Connection {
        &self.connection
    }

    pub fn gate(&self) -> &Arc<Gate> {
        &self.gate
    }

    pub fn guard(&self) -> &Guard {
        &self.gate.guard
    }

    pub fn observer(&self) -> &Arc<Observer> {
        &self.gate.observer
    }

    /// The faults of the store the gateway uses.
    pub fn faults(&self) -> &FaultHandle {
        self.gate.faults()
    }

    /// The reverse proxy: every request goes through the gate.
    pub fn proxy_router(&self) -> Router {
        async fn proxy(State(gateway): State<Gateway>, req: Request) -> axum::http::Response<Body> {
            let Gateway { gate, upstream, .. } = gateway;
            gate.handle(req, |req| async move { upstream.forward(req).await })
                .await
        }
        Router::new().fallback(proxy).with_state(self.clone())
    }
}

/// Serves the proxy on `proxy` (and the admin API on `admin`, if given)
/// until `shutdown` resolves; then stops accepting and lets in-flight
/// requests finish.
pub async fn run(
    gateway: Gateway,
    proxy: TcpListener,
    admin: Option<AdminListener>,
    shutdown: impl Future<Output = ()>,
) {
    let (stop_tx, stop) = watch::channel(false);
    if let Ok(addr) = proxy.local_addr() {
        gateway.observer().set_listen(&addr.to_string());
    }
    let config = gateway.gate.config.clone();
    let limits = serve::HttpLimits::from(&config);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(serve::serve(
        proxy,
        gateway.proxy_router(),
        limits,
        serve::Peer::Untold,
        stop.clone(),
    ));
    if let Some(admin) = admin {
        let router = admin::router(gateway.clone(), admin.token, stop.clone());
        tasks.spawn(serve::serve(
            admin.listener,
            router,
            limits,
            serve::Peer::Told,
            stop.clone(),
        ));
    }
    shutdown.await;
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
}
