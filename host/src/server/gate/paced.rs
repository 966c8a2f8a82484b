//! The slow-client bounds on a request body, as a body: [`Paced`] hands on
//! the client's frames and fails once the body falls behind its deadline —
//! `body_read_timeout` in all, and after a grace of 2 s no slower than
//! `min_body_rate` bytes per second. The gateway reads a guarded body
//! through it before claiming the key, and streams an unguarded one through
//! it to the upstream, so that neither kind lets a slow client hold what it
//! holds (a connection; for an unguarded request, a slot) for longer.

use crate::latch::Latch;
use axum::body::{Body, HttpBody};
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// How long a slow body may take before the minimum rate applies.
pub(crate) const BODY_GRACE: Duration = Duration::from_secs(2);

/// The error a [`Paced`] body ends with when it falls behind.
#[derive(Debug, thiserror::Error)]
#[error("the request body fell behind its deadline (too slow a client)")]
pub(crate) struct TooSlow;

/// How far a [`Paced`] body has come, for whoever forwards it: whether it
/// was cut (the client's fault, not the upstream's), and when it is all
/// sent (the upstream's time starts then).
#[derive(Default)]
pub(crate) struct Progress {
    cut: AtomicBool,
    over: Latch,
}

impl Progress {
    pub(crate) fn was_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    /// Resolves once the body has all been read, or was cut.
    pub(crate) async fn over(&self) {
        self.over.wait().await;
    }

    fn end(&self, cut: bool) {
        if cut {
            self.cut.store(true, Ordering::Relaxed);
        }
        self.over.set();
    }
}

/// A request body under the slow-client bounds. A frame that is already
/// there is handed on without arming a timer; only a wait is bounded.
pub(crate) struct Paced {
    inner: Body,
    started: Instant,
    overall: Instant,
    min_rate: u64,
    received: u64,
    timer: Option<Pin<Box<Sleep>>>,
    /// Told how far the body has come, when someone watches
    /// ([`Paced::watched`]).
    progress: Option<Arc<Progress>>,
    done: bool,
}

impl Paced {
    /// `body`, from now on bounded by `timeout` in all and `min_rate` bytes
    /// per second after [`BODY_GRACE`].
    pub(crate) fn new(body: Body, timeout: Duration, min_rate: u64) -> Paced {
        let started = Instant::now();
        Paced {
            inner: body,
            started,
            overall: started + timeout,
            min_rate: min_rate.max(1),
            received: 0,
            timer: None,
            progress: None,
            done: false,
        }
    }

    /// [`Paced::new`], and its [`Progress`] for whoever forwards it.
    pub(crate) fn watched(body: Body, timeout: Duration, min_rate: u64) -> (Paced, Arc<Progress>) {
        let progress = Arc::new(Progress::default());
        let mut paced = Paced::new(body, timeout, min_rate);
        paced.progress = Some(Arc::clone(&progress));
        (paced, progress)
    }

    fn end(&mut self, cut: bool) {
        self.done = true;
        if let Some(progress) = &self.progress {
            progress.end(cut);
        }
    }

    /// When the bytes received so far fall under the minimum rate, or the
    /// whole body's time runs out, whichever comes first.
    fn deadline(&self) -> Instant {
        let earned = Duration::from_millis(self.received.saturating_mul(1000) / self.min_rate);
        self.overall.min(self.started + BODY_GRACE + earned)
    }
}

impl HttpBody for Paced {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            if let Some(Ok(frame)) = &frame
                && let Some(data) = frame.data_ref()
            {
                self.received += data.len() as u64;
            }
            // The last frame: a reader may stop here, on `is_end_stream`.
            if !matches!(frame, Some(Ok(_))) || self.inner.is_end_stream() {
                self.end(false);
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = self.deadline();
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        ready!(timer.as_mut().poll(cx));
        self.end(true);
        Poll::Ready(Some(Err(TooSlow.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
