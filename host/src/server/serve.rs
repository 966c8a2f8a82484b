//! The accept loop: HTTP/1.1 with header limits, one task per connection,
//! and a graceful shutdown that lets in-flight requests finish.

use super::poll_again::PollAgain;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Limits on what a client may send before a request is routed.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    pub max_headers: usize,
    pub max_header_bytes: usize,
    /// How long shutdown waits for in-flight requests.
    pub drain_timeout: Duration,
}

/// Serves `router` on `listener` until `stop` turns true, then stops
/// accepting and waits (up to the drain timeout) for open requests.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
    mut stop: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .max_headers(limits.max_headers)
        .max_buf_size(limits.max_header_bytes)
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _peer)) = accepted else {
                    // Out of file descriptors or similar: back off briefly rather than spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let service = TowerToHyperService::new(router.clone());
                let connection = builder.serve_connection(TokioIo::new(stream), service);
                let connection = graceful.watch(connection);
                tokio::spawn(PollAgain::new(async move {
                    let _ = connection.await;
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
