//! [`Latch`]: a flag set once, and a wait for it.

use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

/// A flag that is set once and never cleared, and a wait for it that cannot
/// miss the setting: the waiter registers with the [`Notify`] before it
/// reads the flag, so a `set` between the two still wakes it.
#[derive(Debug, Default)]
pub(crate) struct Latch {
    set: AtomicBool,
    notify: Notify,
}

impl Latch {
    /// Sets the flag and wakes every waiter.
    pub(crate) fn set(&self) {
        self.set.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Resolves once the flag is set: at once if it is.
    pub(crate) async fn wait(&self) {
        loop {
            let set = self.notify.notified();
            tokio::pin!(set);
            set.as_mut().enable();
            if self.is_set() {
                return;
            }
            set.await;
        }
    }
}
