//! A single-waiter wake-up signal for tasks on one executor.
//!
//! Lives on one shard; never crosses cores. `notify` before `wait` is
//! remembered (one pending notification), so a wake-up is never lost, and
//! many notifications before the waiter runs coalesce into one.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

#[derive(Default)]
pub struct Signal {
    notified: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Signal {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn notify(&self) {
        self.notified.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Waits for the next notification (or returns at once if one is pending).
    pub async fn wait(&self) {
        poll_fn(|cx| {
            if self.notified.replace(false) {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}
