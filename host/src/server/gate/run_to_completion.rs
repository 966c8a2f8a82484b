//! A future that finishes even when its request is dropped.

#[allow(clippy::wildcard_imports)]
use super::*;

/// A future that finishes even when dropped: polled in place while its
/// owner polls it, and spawned onto the runtime with whatever is left if its
/// owner drops it before it is done (a client disconnected). Unlike spawning
/// it up front, the common case pays no hand-off to another worker thread.
/// A panic inside it is caught and returned as `Err`, as a task's would be,
/// so that it ends one request and not the whole connection.
pub(super) struct RunToCompletion<T: Send + 'static> {
    inner: Option<Pin<Box<dyn Future<Output = std::thread::Result<T>> + Send>>>,
}

impl<T: Send + 'static> RunToCompletion<T> {
    pub(super) fn new(future: impl Future<Output = T> + Send + 'static) -> Self {
        RunToCompletion {
            inner: Some(Box::pin(AssertUnwindSafe(future).catch_unwind())),
        }
    }
}

impl<T: Send + 'static> Future for RunToCompletion<T> {
    type Output = std::thread::Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self
            .inner
            .as_mut()
            .expect("RunToCompletion polled after it completed");
        let output = std::task::ready!(inner.as_mut().poll(cx));
        self.inner = None;
        Poll::Ready(output)
    }
}

impl<T: Send + 'static> Drop for RunToCompletion<T> {
    fn drop(&mut self) {
        if let Some(rest) = self.inner.take() {
            // The box keeps the half-run future where it is; only the box moves.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = rest.await;
                });
            }
        }
    }
}
