//! Timing as a hook: `Timed<S>` records how long each atomic operation of
//! `S` took into its [`Latencies`], which the gateway's stats and metrics
//! read as percentiles, and tells a [`CallListener`] (the gateway's
//! observer: failure logs, a key's history, trace spans) of each call.

use super::hooked::{Hook, Hooked};
use super::{Op, Store, StoreError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Store latencies kept for percentiles.
const SAMPLES: usize = 4096;

/// The durations of the latest store operations. Clones share them.
#[derive(Clone, Default)]
pub struct Latencies {
    ring: Arc<Mutex<Ring>>,
}

#[derive(Default)]
struct Ring {
    samples_us: Vec<u32>,
    next: usize,
}

/// Store latency percentiles, in microseconds: the admin API's
/// `store_latency_us` object.
pub use idem_admin_api::Percentiles;

impl Latencies {
    pub fn record(&self, took: Duration) {
        let us = took.as_micros().min(u128::from(u32::MAX)) as u32;
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.samples_us.len() < SAMPLES {
            ring.samples_us.push(us);
        } else {
            let i = ring.next;
            ring.samples_us[i] = us;
        }
        ring.next = (ring.next + 1) % SAMPLES;
    }

    /// Percentiles of the latest operations (all zero before the first).
    #[allow(clippy::cast_precision_loss, clippy::cast_sign_loss)] // an index into at most 4096 samples
    pub fn percentiles_us(&self) -> Percentiles {
        let mut samples = self
            .ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .samples_us
            .clone();
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_unstable();
        let at = |q: f64| u64::from(samples[((samples.len() - 1) as f64 * q).round() as usize]);
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: u64::from(samples[samples.len() - 1]),
        }
    }
}

/// Hears of every atomic call of a [`Timed`] store once it is over: which
/// operation, on which key, how long it took and whether it failed. It runs
/// on the caller's thread, inside the call's trace context.
pub trait CallListener: Send + Sync + 'static {
    fn called(&self, op: Op, key: &str, took: Duration, outcome: Result<(), &StoreError>);
}

/// The hook of a [`Timed`] store: where its timings go, and who hears of
/// each call.
#[derive(Clone)]
pub struct Timing {
    latencies: Latencies,
    listener: Option<Arc<dyn CallListener>>,
}

impl Timing {
    pub fn latencies(&self) -> &Latencies {
        &self.latencies
    }
}

impl Hook for Timing {
    const TIMES: bool = true;

    fn after(&self, op: Op, key: &str, took: Option<Duration>, outcome: Result<(), &StoreError>) {
        let Some(took) = took else { return };
        self.latencies.record(took);
        if let Some(listener) = &self.listener {
            listener.called(op, key, took, outcome);
        }
    }
}

/// A store whose atomic operations are timed into [`Latencies`] and told to
/// a [`CallListener`].
pub type Timed<S> = Hooked<S, Timing>;

impl<S: Store> Timed<S> {
    pub fn new(inner: S, latencies: Latencies, listener: Option<Arc<dyn CallListener>>) -> Self {
        Hooked::wrap(
            inner,
            Timing {
                latencies,
                listener,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_samples() {
        let latencies = Latencies::default();
        assert_eq!(latencies.percentiles_us(), Percentiles::default());
        for us in 1..=100 {
            latencies.record(Duration::from_micros(us));
        }
        let p = latencies.percentiles_us();
        assert_eq!((p.p50, p.p99, p.max), (51, 99, 100));
    }
}
