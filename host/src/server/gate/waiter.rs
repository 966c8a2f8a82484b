//! A repeat waiting, in this process, for its key's request to end.

#[allow(clippy::wildcard_imports)]
use super::*;

/// A repeat's registration to be woken when its key's request in this
/// process ends. Every registration is made and dropped under the map's
/// lock, and the last one out removes the key's entry: no entry outlives
/// the requests waiting on it.
pub(super) struct Waiter<'a> {
    gate: &'a Gate,
    key: &'a str,
    notify: Option<Arc<Notify>>,
}

impl<'a> Waiter<'a> {
    pub(super) fn new(gate: &'a Gate, key: &'a str) -> Self {
        let mut waiters = gate.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let notify = waiters.entry(key.to_owned()).or_default().clone();
        Waiter {
            gate,
            key,
            notify: Some(notify),
        }
    }

    pub(super) fn notify(&self) -> &Notify {
        self.notify.as_deref().expect("held until dropped")
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut waiters = self
            .gate
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mine = self.notify.take().expect("dropped once");
        if let Some(entry) = waiters.get(self.key)
            && Arc::ptr_eq(entry, &mine)
            && Arc::strong_count(&mine) == 2
        {
            waiters.remove(self.key);
        }
        drop(mine);
    }
}
