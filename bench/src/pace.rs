//! The producers' pace, and the search for the highest sustainable rate.
//!
//! [`Pace`] is shared by every producer task of a run: the rate each sends
//! at (0 = as fast as it can) and when to stop. A fixed-rate or `--rate 0`
//! run sets it once; the sustainable-rate search (`--sustainable`) changes
//! the rate while the producers run, then fixes it and sets the stop time.
//!
//! [`RateSearch`] is that search's controller, in the spirit of the
//! OpenMessaging Benchmark's backlog-aware rate control: once per period it
//! looks at what was acknowledged and what was received; when the
//! consumers fell behind (a receive backlog of more than 50 ms of the rate)
//! or the producers fell more than 2 % short of the rate or more than 20 ms
//! behind their schedule, it steps down to what was
//! actually achieved and halves its step; otherwise it steps up by the
//! step. It is done when a rate passes after the step has shrunk to 1/32
//! (the ceiling was hit five times): that rate is the sustainable one. A
//! `--rate 0` run measures a growing backlog once the producer outruns its
//! consumers (its end-to-end latency is then the backlog's age); a
//! sustainable run measures the broker at a rate it keeps up with.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where a search starts when `--rate` does not say (msg/s over all producers).
pub const SEARCH_START_RATE: f64 = 10_000.0;
/// One observation period of the search.
pub const SEARCH_PERIOD: Duration = Duration::from_secs(1);
/// Smallest step; a rate that passes at this step ends the search.
const STEP_MIN: f64 = 1.0 / 32.0;
/// The consumers may lag this much of a period's rate and still keep up
/// (messages in receiver queues, receipts not yet seen)...
const BACKLOG_SLACK_S: f64 = 0.05;
/// ... and the producers may fall this much short of it (receipts of the
/// last messages of a period arrive in the next) ...
const PRODUCE_SLACK: f64 = 0.02;
/// ... plus this many messages, for low rates.
const SLACK_MSGS: f64 = 100.0;
/// A producer this far behind its schedule did not keep the rate (a
/// shortfall under `PRODUCE_SLACK` per period still adds up: 1 % of a
/// second is 10 ms more lag each second).
const LAG_MAX: Duration = Duration::from_millis(20);
/// A rate the search never goes below (msg/s).
const RATE_FLOOR: f64 = 100.0;

/// Shared by the producers of a run (see the module doc).
pub struct Pace {
    origin: Instant,
    /// Messages per second per producer (f64 bits); 0 = as fast as possible.
    rate_bits: AtomicU64,
    /// Bumped by every rate change, so that producers re-base their schedule.
    version: AtomicU64,
    /// Nanoseconds after `origin` of the last rate change: every producer
    /// re-bases on this one instant, so their phases stay spread.
    changed_ns: AtomicU64,
    /// Nanoseconds after `origin` at which producers stop; `u64::MAX` = not set.
    stop_ns: AtomicU64,
    /// The most any producer was behind its schedule since the last
    /// [`take_lag`](Pace::take_lag), in nanoseconds (only lags over
    /// [`LAG_NOTE_MIN`] are noted).
    lag_ns: AtomicU64,
}

/// Lags under this are timer granularity, not a producer falling behind.
const LAG_NOTE_MIN: Duration = Duration::from_millis(2);

impl Pace {
    pub fn new(origin: Instant, rate_per_producer: f64, stop_at: Option<Instant>) -> Pace {
        let pace = Pace {
            origin,
            rate_bits: AtomicU64::new(rate_per_producer.max(0.0).to_bits()),
            version: AtomicU64::new(0),
            changed_ns: AtomicU64::new(0),
            stop_ns: AtomicU64::new(u64::MAX),
            lag_ns: AtomicU64::new(0),
        };
        if let Some(at) = stop_at {
            pace.set_stop(at);
        }
        pace
    }

    /// The rate's version and value (messages per second per producer).
    pub fn rate(&self) -> (u64, f64) {
        let version = self.version.load(Ordering::Acquire);
        (version, f64::from_bits(self.rate_bits.load(Ordering::Relaxed)))
    }

    /// Change the rate; producers follow from their next message on,
    /// counting from the moment they notice.
    pub fn set_rate(&self, rate_per_producer: f64) {
        self.rate_bits.store(rate_per_producer.max(0.0).to_bits(), Ordering::Relaxed);
        let ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.changed_ns.store(ns, Ordering::Relaxed);
        self.version.fetch_add(1, Ordering::Release);
    }

    pub fn set_stop(&self, at: Instant) {
        let ns = u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX - 1);
        self.stop_ns.store(ns, Ordering::Release);
    }

    /// A producer is `lag` behind its schedule.
    pub fn note_lag(&self, lag: Duration) {
        if lag > LAG_NOTE_MIN {
            self.lag_ns.fetch_max(u64::try_from(lag.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        }
    }

    /// The largest lag noted since the last call (zero if none over
    /// [`LAG_NOTE_MIN`]).
    pub fn take_lag(&self) -> Duration {
        Duration::from_nanos(self.lag_ns.swap(0, Ordering::Relaxed))
    }

    /// When the rate last changed (the origin if it never did).
    pub fn changed_at(&self) -> Instant {
        self.origin + Duration::from_nanos(self.changed_ns.load(Ordering::Relaxed))
    }

    pub fn stop_at(&self) -> Option<Instant> {
        match self.stop_ns.load(Ordering::Acquire) {
            u64::MAX => None,
            ns => Some(self.origin + Duration::from_nanos(ns)),
        }
    }
}

/// One producer's schedule under a [`Pace`]: message `i`'s intended send
/// time is `base + (i - base_i + skip + phase) / rate`. A rate that never
/// changes gives `start + (i + phase) / rate`. When the rate changes, every
/// producer re-bases on the instant of the change (`base`; shared, so the
/// phases stay spread) from the first slot not already past when it
/// notices (`skip` slots in). `phase` (in `[0, 1)`, a fraction of one
/// interval) spreads the producers of a run evenly over an interval, as
/// independent clients would be, instead of every producer sending in the
/// same instant.
pub struct Schedule {
    version: Option<u64>,
    rate: f64,
    base: Instant,
    base_i: u64,
    skip: u64,
    phase: f64,
}

impl Schedule {
    pub fn new(start: Instant, phase: f64) -> Schedule {
        assert!((0.0..1.0).contains(&phase), "phase {phase} is a fraction of an interval");
        Schedule { version: None, rate: 0.0, base: start, base_i: 0, skip: 0, phase }
    }

    /// Message `i`'s intended send time, or `None` when the rate is "as
    /// fast as possible".
    pub fn intended(&mut self, pace: &Pace, i: u64) -> Option<Instant> {
        let (version, rate) = pace.rate();
        if self.version != Some(version) {
            if self.version.is_some() {
                // Slot j is at `base + (j + phase) / rate`: the first at or
                // after now.
                self.base = pace.changed_at();
                self.base_i = i;
                let behind = Instant::now().saturating_duration_since(self.base).as_secs_f64();
                self.skip = if rate > 0.0 { (behind * rate - self.phase).ceil().max(0.0) as u64 } else { 0 };
            }
            self.version = Some(version);
            self.rate = rate;
        }
        (self.rate > 0.0).then(|| {
            self.base + Duration::from_secs_f64(((i - self.base_i + self.skip) as f64 + self.phase) / self.rate)
        })
    }
}

/// What one period of the search saw.
#[derive(Debug, Clone, Copy)]
pub struct Period {
    pub secs: f64,
    /// Receipts in the period.
    pub produced: u64,
    /// Messages received in the period, per subscription.
    pub consumed: f64,
    /// Acknowledged and not yet received at the period's end, per subscription.
    pub backlog: f64,
    /// The most a producer was behind its schedule in the period.
    pub lag: Duration,
}

/// The verdict on one period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Sent at the rate and received as fast.
    Kept,
    /// The consumers fell behind.
    ConsumersBehind,
    /// The producers did not manage the rate.
    ProducersShort,
}

/// One step of the search (in the JSON result, `sustainable.steps`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SearchStep {
    /// Seconds since the search started, at the period's end.
    pub t_s: f64,
    /// Rate tried in the period, msg/s over all producers.
    pub rate: f64,
    pub produce_msgs_per_s: f64,
    /// Per subscription.
    pub consume_msgs_per_s: f64,
    pub backlog: f64,
    /// The most a producer was behind its schedule, ms.
    #[serde(default)]
    pub lag_ms: f64,
    pub verdict: Verdict,
}

/// The search's outcome (the JSON result's `sustainable`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SearchResult {
    /// The rate the measured window ran at, msg/s over all producers.
    pub rate: f64,
    /// False when the search ran out of time (`search_max_s`) before it
    /// settled; `rate` is then the last rate that was kept (or the last tried).
    pub converged: bool,
    pub search_s: f64,
    pub steps: Vec<SearchStep>,
    /// The measured window kept up at `rate`: it produced at least 99 % of
    /// the rate and received at least 99 % of what it produced. Filled in
    /// when the run's totals are known.
    #[serde(default)]
    pub held: Option<bool>,
}

/// The search's controller (see the module doc). Pure: it sees numbers and
/// returns the next rate, so it is tested against a model.
pub struct RateSearch {
    rate: f64,
    step: f64,
    last_kept: Option<f64>,
    pub steps: Vec<SearchStep>,
}

/// What the controller says after a period.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    Try(f64),
    Done(f64),
}

impl RateSearch {
    pub fn new(start_rate: f64) -> RateSearch {
        RateSearch { rate: start_rate.max(RATE_FLOOR), step: 1.0, last_kept: None, steps: Vec::new() }
    }

    /// The rate to try now.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The rate to settle on if the search must stop now.
    pub fn fallback(&self) -> f64 {
        self.last_kept.unwrap_or(self.rate)
    }

    /// Judge the period just ended (run at `self.rate()`), at `t_s` seconds
    /// into the search, and say what to do next.
    pub fn observe(&mut self, t_s: f64, p: Period) -> Next {
        let secs = p.secs.max(1e-3);
        let expected = self.rate * secs;

        let produce_rate = p.produced as f64 / secs;
        let consume_rate = p.consumed / secs;
        let verdict = if p.backlog > self.rate * BACKLOG_SLACK_S + SLACK_MSGS {
            Verdict::ConsumersBehind
        } else if expected - p.produced as f64 > expected * PRODUCE_SLACK + SLACK_MSGS || p.lag > LAG_MAX {
            Verdict::ProducersShort
        } else {
            Verdict::Kept
        };
        self.steps.push(SearchStep {
            t_s,
            rate: self.rate,
            produce_msgs_per_s: produce_rate,
            consume_msgs_per_s: consume_rate,
            backlog: p.backlog,
            lag_ms: p.lag.as_secs_f64() * 1e3,
            verdict,
        });
        let next = match verdict {
            Verdict::Kept => {
                self.last_kept = Some(self.rate);
                if self.step <= STEP_MIN {
                    return Next::Done(self.rate);
                }
                self.rate * (1.0 + self.step)
            }
            Verdict::ConsumersBehind | Verdict::ProducersShort => {
                self.step = (self.step / 2.0).max(STEP_MIN);
                let achieved = if verdict == Verdict::ConsumersBehind {
                    // What the consumers managed, less enough to drain the
                    // backlog over the next two periods (never below half of it).
                    (consume_rate - p.backlog / (2.0 * secs)).max(consume_rate / 2.0)
                } else {
                    produce_rate * 0.95
                };
                match self.last_kept {
                    // Overshot a rate that was kept: come back to just under
                    // it rather than to one noisy period's figure.
                    Some(kept) if kept < self.rate => achieved.max(kept * (1.0 - self.step)),
                    // Failed at or below the last rate kept: that one is stale.
                    _ => {
                        self.last_kept = None;
                        achieved
                    }
                }
            }
        };
        self.rate = next.max(RATE_FLOOR);
        Next::Try(self.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A system whose producers manage at most `produce_max` and whose
    /// consumers at most `consume_max` msg/s, with 1 s periods.
    fn simulate(start: f64, produce_max: f64, consume_max: f64, periods: usize) -> (Option<f64>, RateSearch) {
        let mut search = RateSearch::new(start);
        let mut backlog = 0.0;
        for k in 0..periods {
            let produced = search.rate().min(produce_max);
            let consumed = (backlog + produced).min(consume_max);
            backlog += produced - consumed;
            let lag = Duration::ZERO;
            let p = Period { secs: 1.0, produced: produced as u64, consumed, backlog, lag };
            if let Next::Done(rate) = search.observe(k as f64 + 1.0, p) {
                return (Some(rate), search);
            }
        }
        (None, search)
    }

    /// Goal: the search settles a little below the tighter of the two
    /// limits, within a bounded number of periods, whichever side limits.
    /// Method: the model above, for consumer- and producer-bound systems of
    /// several sizes.
    #[test]
    fn settles_just_below_the_limit() {
        for (produce_max, consume_max) in
            [(400_000.0, 220_000.0), (150_000.0, 900_000.0), (5_000.0, 1e9), (3e6, 2.5e6), (50_000.0, 49_000.0)]
        {
            let limit = f64::min(produce_max, consume_max);
            let (done, search) = simulate(SEARCH_START_RATE, produce_max, consume_max, 60);
            let rate = done.unwrap_or_else(|| panic!("no settle for {produce_max}/{consume_max}: {:?}", search.steps));
            // Within the slack (2 % + 100 msgs) the model cannot tell.
            assert!(rate <= limit * 1.03 + SLACK_MSGS, "{rate} above the limit {limit}: {:?}", search.steps);
            assert!(rate >= limit * 0.80, "{rate} far below the limit {limit}: {:?}", search.steps);
            assert_eq!(search.steps.last().map(|s| s.verdict), Some(Verdict::Kept));
        }
    }

    /// Goal: a search stopped early falls back to the last rate kept, not
    /// to a rate that failed.
    #[test]
    fn fallback_is_the_last_rate_kept() {
        let (_, search) = simulate(SEARCH_START_RATE, 1e9, 30_000.0, 4);
        let kept: Vec<f64> = search.steps.iter().filter(|s| s.verdict == Verdict::Kept).map(|s| s.rate).collect();
        assert_eq!(search.fallback(), *kept.last().unwrap_or(&search.rate()));
        assert!(search.fallback() <= 30_000.0);
    }

    /// Goal: producers with phases k / n of one interval send evenly spread
    /// (not all at once), each still at the rate, before and after a
    /// change of rate.
    #[test]
    fn phases_spread_producers_over_an_interval() {
        let start = Instant::now();
        let pace = Pace::new(start, 1.0, None);
        let n = 4;
        let mut s: Vec<Schedule> = (0..n).map(|k| Schedule::new(start, k as f64 / n as f64)).collect();
        for i in 0..3u64 {
            for (k, s) in s.iter_mut().enumerate() {
                let want = start + Duration::from_secs(i) + Duration::from_millis(250 * k as u64);
                assert_eq!(s.intended(&pace, i), Some(want), "producer {k}, message {i}");
            }
        }
        // Producers notice a change at different moments (after their own
        // sends, which carry their phases): they re-base on the change's
        // instant, so each keeps its place in the interval.
        pace.set_rate(10.0);
        let changed = pace.changed_at();
        for (k, s) in s.iter_mut().enumerate() {
            std::thread::sleep(Duration::from_millis(7));
            let at = s.intended(&pace, 3).expect("a rate");
            assert!(at >= changed, "producer {k}: not before the change");
            let offset = (at - changed).as_nanos() % 100_000_000;
            let want = 25_000_000 * k as u128;
            assert!(offset.abs_diff(want) < 1_000, "producer {k}: {offset} ns into the interval, want {want}");
            assert_eq!(s.intended(&pace, 4), Some(at + Duration::from_millis(100)), "still at the rate");
        }
    }

    /// Goal: a fixed rate schedules `start + i / rate`; a change re-bases
    /// from the moment it is noticed, and "as fast as possible" has no
    /// schedule.
    #[test]
    fn schedule_follows_the_pace() {
        let start = Instant::now();
        let pace = Pace::new(start, 1000.0, None);
        let mut s = Schedule::new(start, 0.0);
        assert_eq!(s.intended(&pace, 0), Some(start));
        assert_eq!(s.intended(&pace, 500), Some(start + Duration::from_millis(500)));
        let before = Instant::now();
        pace.set_rate(10.0);
        let at = s.intended(&pace, 501).expect("a rate");
        assert!(at >= before, "re-based to now");
        assert_eq!(s.intended(&pace, 502), Some(at + Duration::from_millis(100)));
        pace.set_rate(0.0);
        assert_eq!(s.intended(&pace, 503), None);
        assert_eq!(pace.stop_at(), None);
        pace.note_lag(Duration::from_millis(1));
        assert_eq!(pace.take_lag(), Duration::ZERO, "timer granularity is not lag");
        pace.note_lag(Duration::from_millis(30));
        pace.note_lag(Duration::from_millis(5));
        assert_eq!(pace.take_lag(), Duration::from_millis(30));
        assert_eq!(pace.take_lag(), Duration::ZERO, "taken");
        pace.set_stop(start + Duration::from_secs(3));
        assert_eq!(pace.stop_at(), Some(start + Duration::from_secs(3)));
    }
}
