//! What a handler holds while it runs: its claim, whose lease is renewed in
//! the background, and the checkpoints it records. Both write the claim's
//! record, and each write moves the fence, so they take turns on one shared
//! claim: each presents the claim the last one returned.

use super::{Fence, Guard};
use idem_guest::model::{Checkpoint, Claim, GuardError};
use std::sync::Arc;
use std::time::Duration;

/// A running handler's claim (see [`Guard::run_resumable`]). Cheap to
/// clone; clones share the claim.
#[derive(Clone)]
pub struct Progress {
    guard: Guard,
    claim: Arc<tokio::sync::Mutex<Claim>>,
    resumed: Option<Checkpoint>,
    fence: Fence,
}

impl Progress {
    pub(super) fn new(guard: Guard, claim: Claim) -> Progress {
        Progress {
            guard,
            resumed: claim.checkpoint.clone(),
            fence: Fence(claim.fence),
            claim: Arc::new(tokio::sync::Mutex::new(claim)),
        }
    }

    /// The last checkpoint an earlier holder of the key recorded (whose
    /// lease ran out, or who released the key): continue after it. `None`
    /// when no holder recorded one: start from the beginning.
    pub fn resumed(&self) -> Option<&Checkpoint> {
        self.resumed.as_ref()
    }

    /// The claim's fence when the handler started. Each checkpoint (and
    /// each renewal) raises it; [`Progress::checkpoint`] returns the new one.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    /// Records that the operation got as far as `phase`, with the `data` it
    /// needs to continue from there (at most the guard's
    /// `max_response_bytes`; `phase` 1 to 64 bytes, no control characters).
    /// Call it once a step's effect is durable and before the next step
    /// starts: a holder that takes the key over after this one crashes gets
    /// it from [`Progress::resumed`] and repeats at most the step that was
    /// running. Also extends the lease. Returns the claim's new fence.
    ///
    /// Fails as the guard does: `Unavailable` when the store cannot say
    /// whether it was recorded (the handler should stop, as at a crash),
    /// `StaleClaim` when the key was taken over, `InvalidInput` for a phase
    /// or data over its limit.
    pub async fn checkpoint(
        &self,
        phase: impl Into<String>,
        data: impl Into<Vec<u8>>,
    ) -> Result<Fence, GuardError> {
        let checkpoint = Checkpoint {
            phase: phase.into(),
            data: data.into(),
        };
        let mut held = self.claim.lock().await;
        let next = self.guard.save_checkpoint(held.clone(), checkpoint).await?;
        let fence = Fence(next.fence);
        *held = next;
        Ok(fence)
    }

    /// The claim as last written: the one `complete` or `release` presents.
    pub(super) async fn claim(&self) -> Claim {
        self.claim.lock().await.clone()
    }

    /// Extends the lease of the claim as last written.
    async fn renew(&self) -> Result<(), GuardError> {
        let mut held = self.claim.lock().await;
        *held = self.guard.renew(held.clone()).await?;
        Ok(())
    }
}

impl Guard {
    /// Runs `work` while renewing `progress`'s claim every third of the
    /// lease while `work` is still running (unless the guard was built
    /// without renewal).
    ///
    /// A renewal the store cannot answer is tried again at the next tick (the
    /// lease may still hold); one refused as stale (taken over or expired)
    /// ends the renewing, and the completion will be refused the same way. A
    /// renewal under way when `work` finishes is awaited, so the claim
    /// `progress` holds then matches the store.
    pub(super) async fn holding<T>(&self, progress: &Progress, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        if !self.renew_lease {
            return work.await;
        }
        // A handler that finishes at once arms no timer.
        let once = std::future::poll_fn(|cx| std::task::Poll::Ready(work.as_mut().poll(cx)));
        if let std::task::Poll::Ready(output) = once.await {
            return output;
        }
        let every = Duration::from_millis((self.policy.lease_ms / 3).max(1));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut renewal: Option<std::pin::Pin<Box<dyn Future<Output = _> + Send + '_>>> = None;
        let mut renewing = true;
        loop {
            tokio::select! {
                biased;
                renewed = async { renewal.as_mut().expect("guarded by the condition").await },
                    if renewal.is_some() =>
                {
                    renewal = None;
                    match renewed {
                        Ok(()) | Err(GuardError::Unavailable(_)) => {}
                        Err(_) => renewing = false,
                    }
                }
                output = &mut work => {
                    if let Some(pending) = renewal.take() {
                        let _ = pending.await;
                    }
                    return output;
                }
                _ = tick.tick(), if renewing && renewal.is_none() => {
                    renewal = Some(Box::pin(progress.renew()));
                }
            }
        }
    }
}
