//! Counting and latency accounting: HDR histograms (nanoseconds, 3
//! significant digits) for publish and end-to-end latency, totals over the
//! measured window, and one interval per progress tick.
//!
//! Which samples count: a latency sample counts when its message's *intended*
//! send time falls in the measured window (after warm-up), even if its
//! receipt arrives after the window closed: the slowest messages of a run
//! are not dropped at the end. Throughput counts events (receipts, receives)
//! inside the window.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Highest latency the histograms hold (longer samples saturate): one hour.
pub const LATENCY_NS_MAX: u64 = 3_600_000_000_000;

pub fn new_histogram() -> Histogram<u64> {
    // Bounds and precision are constants that hdrhistogram accepts.
    #[allow(clippy::unwrap_used)]
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).unwrap()
}

/// Percentiles of one histogram, in milliseconds (field names are part of
/// the JSON contract: `p50`, `p99`, `p999`, `max`).
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, Default, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub p9999: f64,
    pub max: f64,
}

fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: h.len(),
            mean: h.mean() / 1e6,
            p50: ns_to_ms(h.value_at_quantile(0.5)),
            p90: ns_to_ms(h.value_at_quantile(0.9)),
            p99: ns_to_ms(h.value_at_quantile(0.99)),
            p999: ns_to_ms(h.value_at_quantile(0.999)),
            p9999: ns_to_ms(h.value_at_quantile(0.9999)),
            max: ns_to_ms(h.max()),
        }
    }
}

/// One progress tick (normally one second).
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default, PartialEq)]
pub struct Tick {
    /// Seconds since the run started (warm-up included).
    pub t_s: f64,
    /// The interval began inside the measured window.
    pub measuring: bool,
    /// `search` (a sustainable-rate search), `warm-up`, `measure` or `drain` (after the window: outstanding
    /// receipts and consumers catching up), by the interval's start.
    pub phase: String,
    pub produce_msgs_per_s: f64,
    pub produce_mb_per_s: f64,
    pub consume_msgs_per_s: f64,
    pub consume_mb_per_s: f64,
    pub publish_p50_ms: f64,
    pub publish_p99_ms: f64,
    pub e2e_p99_ms: f64,
    /// Messages acknowledged by the broker and not yet received, summed
    /// over subscriptions (0 when consumers are ahead of the receipts).
    pub backlog: i64,
    pub publish_errors: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    msgs: u64,
    bytes: u64,
}

impl Counts {
    fn add(&mut self, bytes: usize) {
        self.msgs += 1;
        self.bytes += bytes as u64;
    }
}

struct Inner {
    window_start: Option<Instant>,
    window_end: Option<Instant>,
    /// A sustainable-rate search runs (until the window opens).
    searching: bool,
    publish_total: Histogram<u64>,
    e2e_total: Histogram<u64>,
    publish_tick: Histogram<u64>,
    e2e_tick: Histogram<u64>,
    produced_window: Counts,
    consumed_window: Counts,
    produced_tick: Counts,
    consumed_tick: Counts,
    /// Over the whole run, for the backlog.
    produced_all: u64,
    consumed_all: u64,
    publish_errors: u64,
    publish_errors_tick: u64,
    last_error: Option<String>,
    last_tick: Instant,
    ticks: Vec<Tick>,
}

/// Shared by every producer and consumer task of a run (cheap to clone).
/// The lock is held for a few hundred nanoseconds per sample and never
/// across an `.await`.
#[derive(Clone)]
pub struct Recorder {
    /// The run's time origin; payload timestamps are nanoseconds since it.
    pub epoch: Instant,
    subscriptions: u64,
    inner: Arc<Mutex<Inner>>,
}

/// Totals of a finished run.
#[derive(Debug, Clone)]
pub struct Totals {
    pub window: Duration,
    pub produced_msgs: u64,
    pub produced_bytes: u64,
    pub consumed_msgs: u64,
    pub consumed_bytes: u64,
    pub produced_all: u64,
    pub consumed_all: u64,
    pub publish_errors: u64,
    pub last_error: Option<String>,
    pub publish: Histogram<u64>,
    pub e2e: Histogram<u64>,
    pub ticks: Vec<Tick>,
}

impl Recorder {
    pub fn new(subscriptions: u32) -> Recorder {
        let now = Instant::now();
        Recorder {
            epoch: now,
            subscriptions: u64::from(subscriptions),
            inner: Arc::new(Mutex::new(Inner {
                window_start: None,
                window_end: None,
                searching: false,
                publish_total: new_histogram(),
                e2e_total: new_histogram(),
                publish_tick: new_histogram(),
                e2e_tick: new_histogram(),
                produced_window: Counts::default(),
                consumed_window: Counts::default(),
                produced_tick: Counts::default(),
                consumed_tick: Counts::default(),
                produced_all: 0,
                consumed_all: 0,
                publish_errors: 0,
                publish_errors_tick: 0,
                last_error: None,
                last_tick: now,
                ticks: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock is a bug in this crate; the counts
        // are still meaningful, so go on with them.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nanoseconds since the run's epoch (payload timestamps).
    pub fn stamp(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn instant_of(&self, stamp: u64) -> Instant {
        self.epoch + Duration::from_nanos(stamp)
    }

    /// Open the measured window (the end of warm-up).
    pub fn start_window(&self, at: Instant) {
        let mut inner = self.lock();
        inner.window_start = Some(at);
        inner.searching = false;
    }

    /// A sustainable-rate search begins: ticks say `search` until the
    /// window is set.
    pub fn begin_search(&self) {
        self.lock().searching = true;
    }

    /// Close the measured window: later events no longer count for
    /// throughput (latency samples still count by their intended time).
    pub fn end_window(&self, at: Instant) {
        self.lock().window_end = Some(at);
    }

    fn in_window(inner: &Inner, at: Instant) -> bool {
        inner.window_start.is_some_and(|s| at >= s) && inner.window_end.is_none_or(|e| at < e)
    }

    fn latency_counts(inner: &Inner, intended: Instant) -> bool {
        inner.window_start.is_some_and(|s| intended >= s) && inner.window_end.is_none_or(|e| intended < e)
    }

    /// A receipt for a message meant to be sent at `intended`.
    pub fn published(&self, intended: Instant, now: Instant, bytes: usize) {
        self.published_many(now, &[(intended, bytes)]);
    }

    /// Receipts seen at `now` (e.g. the messages of one batch), each given
    /// as its message's intended send time and size: one lock for them all.
    pub fn published_many(&self, now: Instant, receipts: &[(Instant, usize)]) {
        let mut inner = self.lock();
        let in_window = Self::in_window(&inner, now);
        for &(intended, bytes) in receipts {
            let ns = u64::try_from(now.saturating_duration_since(intended).as_nanos()).unwrap_or(u64::MAX).max(1);
            inner.produced_all += 1;
            inner.produced_tick.add(bytes);
            inner.publish_tick.saturating_record(ns);
            if in_window {
                inner.produced_window.add(bytes);
            }
            if Self::latency_counts(&inner, intended) {
                inner.publish_total.saturating_record(ns);
            }
        }
    }

    pub fn publish_failed(&self, error: String) {
        let mut inner = self.lock();
        inner.publish_errors += 1;
        inner.publish_errors_tick += 1;
        inner.last_error = Some(error);
    }

    /// A message received at `now` that was meant to be sent at `sent`.
    pub fn received(&self, sent: Instant, now: Instant, bytes: usize) {
        let ns = u64::try_from(now.saturating_duration_since(sent).as_nanos()).unwrap_or(u64::MAX).max(1);
        let mut inner = self.lock();
        inner.consumed_all += 1;
        inner.consumed_tick.add(bytes);
        inner.e2e_tick.saturating_record(ns);
        if Self::in_window(&inner, now) {
            inner.consumed_window.add(bytes);
        }
        if Self::latency_counts(&inner, sent) {
            inner.e2e_total.saturating_record(ns);
        }
    }

    /// A received message without a usable latency (counts only).
    pub fn received_untimed(&self, now: Instant, bytes: usize) {
        let mut inner = self.lock();
        inner.consumed_all += 1;
        inner.consumed_tick.add(bytes);
        if Self::in_window(&inner, now) {
            inner.consumed_window.add(bytes);
        }
    }

    /// Messages acknowledged by the broker and not yet received (all subscriptions).
    pub fn backlog(&self) -> i64 {
        let inner = self.lock();
        Self::backlog_of(&inner, self.subscriptions)
    }

    fn backlog_of(inner: &Inner, subscriptions: u64) -> i64 {
        let produced = i128::from(inner.produced_all) * i128::from(subscriptions);
        // A consumer may see a message before its producer sees the receipt.
        i64::try_from((produced - i128::from(inner.consumed_all)).max(0)).unwrap_or(i64::MAX)
    }

    pub fn produced_all(&self) -> u64 {
        self.lock().produced_all
    }

    pub fn consumed_all(&self) -> u64 {
        self.lock().consumed_all
    }

    pub fn publish_errors(&self) -> u64 {
        self.lock().publish_errors
    }

    /// Close the current interval and return it (also kept for the timeline).
    pub fn tick(&self, now: Instant) -> Tick {
        let mut inner = self.lock();
        let secs = now.saturating_duration_since(inner.last_tick).as_secs_f64().max(1e-9);
        let tick = Tick {
            t_s: now.saturating_duration_since(self.epoch).as_secs_f64(),
            measuring: Self::in_window(&inner, inner.last_tick),
            phase: match (inner.window_start, inner.window_end) {
                _ if inner.searching => "search",
                (Some(s), _) if inner.last_tick < s => "warm-up",
                (None, _) => "warm-up",
                (_, Some(e)) if inner.last_tick >= e => "drain",
                _ => "measure",
            }
            .to_string(),
            produce_msgs_per_s: inner.produced_tick.msgs as f64 / secs,
            produce_mb_per_s: inner.produced_tick.bytes as f64 / secs / 1e6,
            consume_msgs_per_s: inner.consumed_tick.msgs as f64 / secs,
            consume_mb_per_s: inner.consumed_tick.bytes as f64 / secs / 1e6,
            publish_p50_ms: Percentiles::of(&inner.publish_tick).p50,
            publish_p99_ms: Percentiles::of(&inner.publish_tick).p99,
            e2e_p99_ms: Percentiles::of(&inner.e2e_tick).p99,
            backlog: Self::backlog_of(&inner, self.subscriptions),
            publish_errors: inner.publish_errors_tick,
        };
        inner.publish_tick.reset();
        inner.e2e_tick.reset();
        inner.produced_tick = Counts::default();
        inner.consumed_tick = Counts::default();
        inner.publish_errors_tick = 0;
        inner.last_tick = now;
        inner.ticks.push(tick.clone());
        tick
    }

    pub fn totals(&self) -> Totals {
        let inner = self.lock();
        let window = match (inner.window_start, inner.window_end) {
            (Some(s), Some(e)) => e.saturating_duration_since(s),
            (Some(s), None) => s.elapsed(),
            _ => Duration::ZERO,
        };
        Totals {
            window,
            produced_msgs: inner.produced_window.msgs,
            produced_bytes: inner.produced_window.bytes,
            consumed_msgs: inner.consumed_window.msgs,
            consumed_bytes: inner.consumed_window.bytes,
            produced_all: inner.produced_all,
            consumed_all: inner.consumed_all,
            publish_errors: inner.publish_errors,
            last_error: inner.last_error.clone(),
            publish: inner.publish_total.clone(),
            e2e: inner.e2e_total.clone(),
            ticks: inner.ticks.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: samples are charged from the intended time, and only samples
    /// intended inside the window count. Method: synthetic instants.
    #[test]
    fn window_and_intended_time() {
        let r = Recorder::new(1);
        let t0 = r.epoch;
        let ms = Duration::from_millis;
        r.published(t0, t0 + ms(5), 100); // warm-up: not in totals
        r.start_window(t0 + ms(10));
        r.end_window(t0 + ms(20));
        r.published(t0 + ms(10), t0 + ms(30), 100); // 20 ms
        r.published(t0 + ms(12), t0 + ms(14), 100); // 2 ms
        r.published(t0 + ms(19), t0 + ms(60), 100); // intended inside: latency counts, throughput not
        r.published(t0 + ms(21), t0 + ms(22), 100); // after the window: nothing
        let t = r.totals();
        assert_eq!(t.publish.len(), 3);
        assert_eq!(t.produced_msgs, 1, "only the receipt at 14 ms fell inside the window");
        assert_eq!(t.produced_all, 5);
        let p = Percentiles::of(&t.publish);
        assert!((p.max - 41.0).abs() < 0.1, "{p:?}");
        assert!((p.p50 - 20.0).abs() < 0.1, "{p:?}");
        assert_eq!(r.backlog(), 5);
    }
}
