//! The accept loop: HTTP/1.1 with header limits and a header read timeout,
//! half-closed clients still answered, at most `max_connections`
//! connections at once (one task each), and a graceful shutdown that lets
//! in-flight requests finish.

use super::poll_again::PollAgain;
use axum::Router;
use axum::extract::ConnectInfo;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt as _;

/// Limits on what a client may send before a request is routed.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    pub max_headers: usize,
    pub max_header_bytes: usize,
    /// How long a client may take to send a request head.
    pub header_read_timeout: Duration,
    /// Connections open at once; past it, no more are accepted until one
    /// closes (they wait in the kernel's backlog).
    pub max_connections: usize,
    /// How long shutdown waits for in-flight requests.
    pub drain_timeout: Duration,
}

impl From<&super::Config> for HttpLimits {
    fn from(config: &super::Config) -> Self {
        HttpLimits {
            max_headers: config.max_headers,
            max_header_bytes: config.max_header_bytes,
            header_read_timeout: config.header_read_timeout,
            max_connections: config.max_connections,
            drain_timeout: config.drain_timeout,
        }
    }
}

/// Whether handlers see the client's address (`ConnectInfo<SocketAddr>`
/// among a request's extensions): the admin API's audit says who asked;
/// the proxy has no use for it, and an extension costs each request two
/// allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Told,
    Untold,
}

/// Serves `router` on `listener` until `stop` turns true, then stops
/// accepting and waits (up to the drain timeout) for open requests.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    peer_to_handlers: Peer,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        // A client may shut down its sending side once the request is out
        // (`shutdown(SHUT_WR)`, `curl` piping a file, some proxies) and wait for
        // the answer: without this hyper takes that EOF for a gone client and
        // drops the connection, although the request goes on and runs.
        .half_close(true)
        .max_headers(limits.max_headers)
        .max_buf_size(limits.max_header_bytes)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let open = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let slot = tokio::select! {
            slot = open.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = stopped(&mut stop) => break,
        };
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else {
                    // Out of file descriptors or similar: back off briefly rather than spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                // The client's address, for handlers that say who asked.
                let told = (peer_to_handlers == Peer::Told).then_some(ConnectInfo(peer));
                let service = TowerToHyperService::new(router.clone().map_request(
                    move |mut req: hyper::Request<hyper::body::Incoming>| {
                        if let Some(peer) = told {
                            req.extensions_mut().insert(peer);
                        }
                        req
                    },
                ));
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                let connection = graceful.watch(connection);
                tokio::spawn(PollAgain::new(async move {
                    let _ = connection.await;
                    drop(slot);
                }));
            }
            () = stopped(&mut stop) => break,
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(limits.drain_timeout, graceful.shutdown()).await;
}

/// Resolves once `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}
