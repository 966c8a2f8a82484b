//! [`PollAgain`]: polls a connection again, in place, when it wakes itself.
//!
//! A handler that reads the request body runs in the same task as hyper's
//! dispatcher, which feeds it the body: each chunk the handler takes wakes
//! the dispatcher, so the task wakes itself while it runs. Tokio treats
//! such a wake as a yield: it puts the task at the back of the queue and
//! wakes another worker to steal it, so the connection moves to the other
//! thread while its request waits for the upstream (about two futex
//! wake-ups per guarded request). `PollAgain` keeps the wake inside the
//! task: it polls the connection again at once, a bounded number of times,
//! and only then hands the wake to tokio, which keeps tokio's fairness.

use futures_util::task::AtomicWaker;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

/// Polls in a row, at most, before a self-wake goes to tokio.
const MAX_POLLS: usize = 4;

const IDLE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN: u8 = 2;

/// A future polled again in place when it wakes itself during a poll.
pub struct PollAgain<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
    waker: Waker,
}

/// What the inner future's waker does: while the future is being polled, it
/// notes the wake; otherwise it wakes the task.
struct Signal {
    state: AtomicU8,
    task: AtomicWaker,
}

impl<F: Future> PollAgain<F> {
    pub fn new(inner: F) -> Self {
        let signal = Arc::new(Signal {
            state: AtomicU8::new(IDLE),
            task: AtomicWaker::new(),
        });
        PollAgain {
            inner: Box::pin(inner),
            waker: Waker::from(signal.clone()),
            signal,
        }
    }
}

impl<F: Future> Future for PollAgain<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.signal.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..MAX_POLLS {
            this.signal.state.store(POLLING, Ordering::SeqCst);
            let poll = this.inner.as_mut().poll(&mut inner_cx);
            // A wake before this swap was noted; one after it wakes the task.
            let woken = this.signal.state.swap(IDLE, Ordering::SeqCst) == WOKEN;
            if poll.is_ready() {
                return poll;
            }
            if !woken {
                return Poll::Pending;
            }
        }
        // Still waking itself: let tokio schedule it like any other task.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self
            .state
            .compare_exchange(POLLING, WOKEN, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
            && self.state.load(Ordering::SeqCst) != WOKEN
        {
            self.task.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Mutex, PoisonError};

    /// Counts the wakes the task (the outer waker) gets.
    #[derive(Default)]
    struct Task(AtomicUsize);

    impl Wake for Task {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes itself during each of its first `self_wakes` polls; then stays
    /// pending until `done`, keeping its waker in `parked`.
    struct Script {
        self_wakes: usize,
        polls: Arc<AtomicUsize>,
        parked: Arc<Mutex<Option<Waker>>>,
        done: Arc<AtomicU8>,
    }

    impl Future for Script {
        type Output = ();
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let n = self.polls.fetch_add(1, Ordering::SeqCst);
            if self.done.load(Ordering::SeqCst) == 1 {
                return Poll::Ready(());
            }
            if n < self.self_wakes {
                cx.waker().wake_by_ref();
            } else {
                let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
                *parked = Some(cx.waker().clone());
            }
            Poll::Pending
        }
    }

    /// What a test sees of its `Script`.
    struct Handles {
        polls: Arc<AtomicUsize>,
        parked: Arc<Mutex<Option<Waker>>>,
        done: Arc<AtomicU8>,
    }

    /// A `Script` in `PollAgain`, polled by a task that counts its wakes.
    struct Polled {
        task: Arc<Task>,
        waker: Waker,
        future: PollAgain<Script>,
        script: Handles,
    }

    impl Polled {
        fn new(self_wakes: usize) -> Self {
            let script = Handles {
                polls: Arc::new(AtomicUsize::new(0)),
                parked: Arc::new(Mutex::new(None)),
                done: Arc::new(AtomicU8::new(0)),
            };
            let future = PollAgain::new(Script {
                self_wakes,
                polls: script.polls.clone(),
                parked: script.parked.clone(),
                done: script.done.clone(),
            });
            let task = Arc::new(Task::default());
            let waker = Waker::from(task.clone());
            Polled {
                task,
                waker,
                future,
                script,
            }
        }

        /// One poll by the task.
        fn poll(&mut self) -> Poll<()> {
            let mut cx = Context::from_waker(&self.waker);
            Pin::new(&mut self.future).poll(&mut cx)
        }

        fn polls(&self) -> usize {
            self.script.polls.load(Ordering::SeqCst)
        }

        fn task_wakes(&self) -> usize {
            self.task.0.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn a_self_wake_is_polled_again_in_place_and_not_handed_to_the_task() {
        let mut run = Polled::new(2);
        assert!(run.poll().is_pending());
        assert_eq!(run.polls(), 3, "two self-wakes, three polls in one");
        assert_eq!(run.task_wakes(), 0, "the task was not woken");
    }

    #[test]
    fn a_wake_from_outside_reaches_the_task_and_the_future_finishes() {
        let mut run = Polled::new(0);
        assert!(run.poll().is_pending());
        let inner = run
            .script
            .parked
            .lock()
            .unwrap()
            .take()
            .expect("the future kept its waker");
        run.script.done.store(1, Ordering::SeqCst);
        std::thread::spawn(move || inner.wake()).join().unwrap();
        assert_eq!(run.task_wakes(), 1);
        assert!(run.poll().is_ready());
    }

    #[test]
    fn a_future_that_keeps_waking_itself_goes_back_to_the_scheduler() {
        let mut run = Polled::new(usize::MAX);
        assert!(run.poll().is_pending());
        assert_eq!(run.polls(), MAX_POLLS);
        assert_eq!(run.task_wakes(), 1, "the task is scheduled again");
    }
}
