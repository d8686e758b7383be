//! The lone-batch policy: which of the flusher's batches are written and
//! synced as one request that blocks the shard thread
//! (`DiskFile::write_and_sync`) instead of through the reactor, as a pure
//! decide/observe pair (no clock, no I/O: the flusher times the requests
//! and reports). See [`LONE_BATCH_BYTES_MAX`], [`LONE_STREAK_MIN`],
//! [`LONE_PAUSE_BATCHES`], [`LONE_RESUME_FAST`] and
//! [`LogConfig::lone_sync_max`](crate::LogConfig::lone_sync_max).

use std::time::Duration;

use crate::log::{LONE_BATCH_BYTES_MAX, LONE_PAUSE_BATCHES, LONE_RESUME_FAST, LONE_STREAK_MIN};

/// How one batch is written and synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// One request blocking the thread: a lone small batch in a run of them
    /// (one producer, one message in flight), the thread having nothing
    /// else to do meanwhile.
    Lone,
    /// Through the reactor. `timed`: a batch that would have gone [`Lone`](Route::Lone)
    /// but for a pause, whose time may end the pause early.
    Reactor { timed: bool },
}

/// The policy's state. Invariants: `fast` is 0 outside a pause (`pause`
/// 0); `streak` counts the batches of one record and at most
/// [`LONE_BATCH_BYTES_MAX`] in a row, up to the last one made durable.
#[derive(Debug, Default)]
pub(crate) struct LonePolicy {
    /// Batches of one record in a row, up to the last one made durable.
    streak: u32,
    /// Batches left that take the reactor path after a lone request took
    /// longer than `lone_sync_max`.
    pause: u32,
    /// During a pause: lone batches in a row whose reactor write + fdatasync
    /// took at most `lone_sync_max` ([`LONE_RESUME_FAST`] end the pause).
    fast: u32,
    /// Lone requests that took longer than `lone_sync_max` since open (a counter).
    pub slow: u64,
    /// Batches written and synced as one request since open (a counter).
    pub batches: u64,
}

impl LonePolicy {
    /// How the next batch, of `count` records and `len` bytes, goes; it
    /// counts against a pause. `sync_max` is `LogConfig::lone_sync_max`
    /// (zero: never [`Route::Lone`]).
    pub fn decide(&mut self, count: usize, len: u64, sync_max: Duration) -> Route {
        let candidate =
            count == 1 && len <= LONE_BATCH_BYTES_MAX && self.streak >= LONE_STREAK_MIN && !sync_max.is_zero();
        let paused = self.pause > 0;
        self.pause = self.pause.saturating_sub(1);
        if candidate && !paused {
            Route::Lone
        } else {
            Route::Reactor { timed: candidate && paused }
        }
    }

    /// A batch `decide` routed `route` was written and synced in `took`.
    /// Returns whether a lone request was slower than `sync_max` (the next
    /// [`LONE_PAUSE_BATCHES`] batches then go through the reactor).
    pub fn observe(&mut self, route: Route, took: Duration, sync_max: Duration) -> bool {
        match route {
            Route::Lone => {
                self.batches += 1;
                if took > sync_max {
                    self.pause = LONE_PAUSE_BATCHES;
                    self.fast = 0;
                    self.slow += 1;
                    return true;
                }
            }
            Route::Reactor { timed: true } => {
                self.fast = if took <= sync_max { self.fast + 1 } else { 0 };
                if self.fast >= LONE_RESUME_FAST {
                    self.pause = 0;
                    self.fast = 0;
                }
            }
            Route::Reactor { timed: false } => {}
        }
        false
    }

    /// A batch of `count` records and `len` bytes is durable.
    pub fn durable(&mut self, count: usize, len: u64) {
        self.streak = if count == 1 && len <= LONE_BATCH_BYTES_MAX { self.streak.saturating_add(1) } else { 0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_millis(1);
    const FAST: Duration = Duration::from_micros(100);
    const SLOW: Duration = Duration::from_millis(5);

    /// Decides, observes (`took`) and makes durable one batch of one page.
    fn one(p: &mut LonePolicy, took: Duration) -> Route {
        let r = p.decide(1, 4096, MAX);
        p.observe(r, took, MAX);
        p.durable(1, 4096);
        r
    }

    /// Goal: a run of lone batches takes the blocking path only after
    /// LONE_STREAK_MIN of them; a batch of two records, or a lone one over
    /// LONE_BATCH_BYTES_MAX, goes through the reactor and starts the run
    /// again. Method: count the routes of a scripted sequence.
    #[test]
    fn lone_path_after_a_run_of_lone_batches() {
        let mut p = LonePolicy::default();
        for _ in 0..LONE_STREAK_MIN {
            assert_eq!(one(&mut p, FAST), Route::Reactor { timed: false });
        }
        assert_eq!(one(&mut p, FAST), Route::Lone);
        assert_eq!(one(&mut p, FAST), Route::Lone);
        assert_eq!(p.batches, 2);
        assert_eq!(p.decide(2, 8192, MAX), Route::Reactor { timed: false });
        p.durable(2, 8192);
        assert_eq!(one(&mut p, FAST), Route::Reactor { timed: false }, "the run starts again");
        for _ in 1..LONE_STREAK_MIN {
            one(&mut p, FAST);
        }
        assert_eq!(p.decide(1, LONE_BATCH_BYTES_MAX + 1, MAX), Route::Reactor { timed: false });
        assert_eq!(p.decide(1, LONE_BATCH_BYTES_MAX, MAX), Route::Lone);
        assert_eq!(p.decide(1, 4096, Duration::ZERO), Route::Reactor { timed: false }, "lone_sync_max 0: never");
    }

    /// Goal: a lone request slower than lone_sync_max sends the next
    /// LONE_PAUSE_BATCHES candidates through the reactor (timed), and the
    /// path comes back after them. Method: slow disk throughout the pause.
    #[test]
    fn a_slow_lone_request_pauses_the_path() {
        let mut p = LonePolicy::default();
        while one(&mut p, FAST) != Route::Lone {}
        let r = p.decide(1, 4096, MAX);
        assert_eq!(r, Route::Lone);
        assert!(p.observe(r, SLOW, MAX), "reported slow");
        p.durable(1, 4096);
        assert_eq!(p.slow, 1);
        for i in 0..LONE_PAUSE_BATCHES {
            assert_eq!(one(&mut p, SLOW), Route::Reactor { timed: true }, "batch {i} of the pause");
        }
        assert_eq!(one(&mut p, FAST), Route::Lone, "the pause ran its course");
        assert_eq!(p.slow, 1, "reactor batches are not lone requests");
    }

    /// Goal: during a pause, LONE_RESUME_FAST fast timed batches in a row
    /// end it early; a slow one among them starts the count again.
    #[test]
    fn fast_batches_in_a_row_end_a_pause_early() {
        let mut p = LonePolicy::default();
        while one(&mut p, FAST) != Route::Lone {}
        assert_eq!(one(&mut p, SLOW), Route::Lone);
        for _ in 0..LONE_RESUME_FAST - 1 {
            assert_eq!(one(&mut p, FAST), Route::Reactor { timed: true });
        }
        assert_eq!(one(&mut p, SLOW), Route::Reactor { timed: true }, "a slow one resets the count");
        for _ in 0..LONE_RESUME_FAST {
            assert_eq!(one(&mut p, FAST), Route::Reactor { timed: true });
        }
        assert_eq!(one(&mut p, FAST), Route::Lone, "ended early, well before LONE_PAUSE_BATCHES");
        const { assert!(2 * LONE_RESUME_FAST + 2 < LONE_PAUSE_BATCHES) };
    }
}
