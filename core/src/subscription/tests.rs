//! Subscriptions and their dispatch policies without a shard: a fake
//! delivery sink records the consumer events, an in-memory log answers
//! reads with ready futures, and `futures::executor::block_on` drives one
//! dispatch pass at a time.

use super::cursor::Cursor;
use super::dispatcher::context::{DeliverySink, DispatchCtx, DispatchLimits, LogReader, RunReceiver};
use super::dispatcher::task::pass;
use super::persist::Dirty;
use super::{NewConsumer, Subscription};
use crate::api::{ConsumerEvent, ConsumerRef};
use crate::topic::ledgers::{LedgerInfo, TopicLedgers};
use crate::topic::Topic;
use crate::topic_name::TopicName;
use bytes::Bytes;
use magnetar_storage::StorageError;
use magnetar_wire::{AckType, MessageId, MessageMetadata, SubscriptionType};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::{ready, Future};
use std::rc::Rc;

const LEDGER: u64 = 7;

/// Records every event in order.
#[derive(Default)]
struct FakeSink {
    events: RefCell<Vec<(ConsumerRef, ConsumerEvent)>>,
}

impl DeliverySink for FakeSink {
    fn deliver(&self, to: ConsumerRef, event: ConsumerEvent) {
        self.events.borrow_mut().push((to, event));
    }
}

/// One ledger's entries in memory; every read is ready at once.
struct MemLog {
    entries: HashMap<(u64, u64), Bytes>,
}

impl MemLog {
    fn run(&self, ledger: u64, entry: u64, max_entries: usize, max_bytes: usize) -> Result<Vec<Bytes>, StorageError> {
        let mut out: Vec<Bytes> = Vec::new();
        let mut bytes = 0;
        while let Some(b) = self.entries.get(&(ledger, entry + out.len() as u64)) {
            if out.len() >= max_entries.max(1) || (!out.is_empty() && bytes + b.len() > max_bytes) {
                break;
            }
            bytes += b.len();
            out.push(b.clone());
        }
        if out.is_empty() {
            return Err(StorageError::NoSuchEntry { ledger, entry });
        }
        Ok(out)
    }
}

impl LogReader for MemLog {
    fn read(&self, ledger: u64, entry: u64) -> impl Future<Output = Result<Bytes, StorageError>> {
        ready(self.entries.get(&(ledger, entry)).cloned().ok_or(StorageError::NoSuchEntry { ledger, entry }))
    }

    fn read_run(
        &self,
        ledger: u64,
        entry: u64,
        max_entries: usize,
        max_bytes: usize,
    ) -> impl Future<Output = Result<Vec<Bytes>, StorageError>> {
        ready(self.run(ledger, entry, max_entries, max_bytes))
    }

    fn read_run_ahead(&self, ledger: u64, entry: u64, max_entries: usize, max_bytes: usize) -> Option<RunReceiver> {
        let (tx, rx) = futures::channel::oneshot::channel();
        let _ = tx.send(self.run(ledger, entry, max_entries, max_bytes));
        Some(rx)
    }

    fn tag_hash(&self, _ledger: u64, _entry: u64) -> Option<u32> {
        None
    }
}

/// A topic of `keys.len()` stored entries (entry i with key `keys[i]`),
/// the first `durable` of them dispatchable, one subscription of type `t`,
/// and a dispatch context over a fake sink and the in-memory log.
struct Bed {
    topic: Rc<Topic>,
    sub: Rc<Subscription>,
    ctx: DispatchCtx<FakeSink, MemLog>,
}

impl Bed {
    fn new(t: SubscriptionType, keys: &[&str], durable: u64, unacked_per_consumer_max: u32) -> Self {
        let n = keys.len() as u64;
        let ledgers = TopicLedgers::new(vec![LedgerInfo {
            id: LEDGER,
            first: 0,
            entries: n,
            bytes: 0,
            created_ms: 1,
            closed_ms: 0,
        }]);
        let name = TopicName::parse("persistent://public/default/sub-tests").expect("a valid name");
        let topic = Rc::new(Topic::new(name.clone(), name.to_string(), ledgers, -1));
        topic.durable_next.set(durable);
        let sub = Subscription::new("s".into(), t, true, Cursor::new(0), -1, 1000);
        topic.subs.borrow_mut().insert("s".into(), sub.clone());
        let entries = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let meta = MessageMetadata {
                    producer_name: "p".into(),
                    sequence_id: i as u64,
                    publish_time_ms: 1,
                    partition_key: (!k.is_empty()).then(|| k.to_string()),
                    num_messages: 1,
                    ..Default::default()
                };
                ((LEDGER, i as u64), magnetar_wire::encode_message(&meta, b"payload"))
            })
            .collect();
        let ctx = DispatchCtx {
            sink: FakeSink::default(),
            log: MemLog { entries },
            limits: DispatchLimits { unacked_per_consumer_max, unacked_per_subscription_max: 10_000 },
            dirty: Rc::new(Dirty::default()),
            closed: Rc::new(Cell::new(false)),
        };
        Self { topic, sub, ctx }
    }

    fn join(&self, id: u64, name: &str, t: SubscriptionType, permits: u32) -> ConsumerRef {
        let c = ConsumerRef { shard: 0, sink: 1, consumer_id: id };
        let new = NewConsumer {
            consumer: c,
            sub_type: t,
            name: name.into(),
            priority: 0,
            filter_tag: String::new(),
            key_shared_ranges: Vec::new(),
            address: String::new(),
            zone: String::new(),
            allocation: Default::default(),
            partitions: 0,
        };
        self.sub.add_consumer(&self.ctx.sink, new).expect("admitted");
        self.sub.flow(c, permits);
        c
    }

    fn pass(&self) {
        futures::executor::block_on(pass(&self.ctx, &self.topic, &self.sub));
        self.check_accounting();
    }

    /// The events since the last call: deliveries as `(consumer id, entry,
    /// redelivery count)`, others as they came.
    fn take(&self) -> (Vec<(u64, u64, u32)>, Vec<ConsumerEvent>) {
        let (mut delivered, mut other) = (Vec::new(), Vec::new());
        for (to, ev) in self.ctx.sink.events.borrow_mut().drain(..) {
            match ev {
                ConsumerEvent::Message { .. } | ConsumerEvent::Run { .. } => {
                    for (id, rc, _) in ev.deliveries() {
                        assert_eq!(id.ledger, LEDGER);
                        delivered.push((to.consumer_id, id.entry, rc));
                    }
                }
                ev => other.push(ev),
            }
        }
        (delivered, other)
    }

    fn ack(&self, entries: &[u64]) {
        let ids: Vec<MessageId> = entries.iter().map(|&e| MessageId::new(LEDGER, e, -1, -1)).collect();
        self.sub.ack(&self.topic, AckType::Individual, &ids, &[]).expect("acked");
        self.check_accounting();
    }

    /// Each consumer's unacked count is the number of pending entries it
    /// holds, and each pending entry's holder is attached.
    fn check_accounting(&self) {
        let pending = self.sub.pending.borrow();
        for c in self.sub.consumers.borrow().iter() {
            let held = pending.iter().filter(|(_, p)| p.consumer == c.consumer).count();
            assert_eq!(c.unacked as usize, held, "unacked of consumer {}", c.consumer.consumer_id);
        }
        for (e, p) in pending.iter() {
            assert!(self.sub.has_consumer(p.consumer), "entry {e} held by a consumer that left");
        }
    }

    fn permits(&self, c: ConsumerRef) -> u64 {
        self.sub.consumers.borrow().iter().find(|s| s.consumer == c).map_or(0, |s| s.permits)
    }
}

/// Two keys whose hashes fall in the lower and the upper half of the hash
/// space: with auto split, the first consumer keeps the lower half and the
/// second takes the upper one.
fn low_and_high_keys() -> (String, String) {
    let half = super::dispatcher::key_shared::HASH_RANGE / 2;
    let hash = |k: &str| u32::from(super::dispatcher::key_hash(None, Some(k.as_bytes())));
    let key = |upper: bool| {
        (0..).map(|i| format!("key-{i}")).find(|k| (hash(k) >= half) == upper).expect("some key hashes there")
    };
    (key(false), key(true))
}

/// Goal: Shared hands each entry to exactly one consumer, round robin over
/// the consumers that have permits and room under the unacked limit, and
/// never past a consumer's permits. Method: random flows and acks between
/// passes over three consumers; each pass's deliveries must equal a model
/// of round robin step by step, and the permit and unacked counts the
/// model's. Prints its seed.
#[test]
fn shared_round_robin_under_permits() {
    let seed = crate::test_seed("shared_round_robin_under_permits");
    let mut rng = magnetar_storage::sim::SimRng::new(seed);
    let n = 400u64;
    let unacked_max = 1 + rng.below(8) as u32;
    let keys = vec![""; n as usize];
    let bed = Bed::new(SubscriptionType::Shared, &keys, n, unacked_max);
    let cs: Vec<ConsumerRef> = (0..3).map(|i| bed.join(i, &format!("c{i}"), SubscriptionType::Shared, 0)).collect();
    // The model: permits and unacked per consumer, the round robin's next
    // index, the next fresh entry, and who holds what.
    let (mut permits, mut unacked) = ([0u64; 3], [0u32; 3]);
    let (mut rr, mut next) = (0usize, 0u64);
    let mut held: Vec<(u64, usize)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    // Enough rounds that the flows (2.5 permits a round on average) cover
    // every entry for almost any seed; the last check keeps that honest.
    for round in 0..600 {
        let i = rng.below(3) as usize;
        let p = rng.below(6) as u32;
        bed.sub.flow(cs[i], p);
        permits[i] += u64::from(p);
        bed.pass();
        let mut want = Vec::new();
        while next < n {
            let Some(k) = (0..3).map(|k| (rr + k) % 3).find(|&k| permits[k] > 0 && unacked[k] < unacked_max) else {
                break;
            };
            want.push((k as u64, next, 0));
            held.push((next, k));
            permits[k] -= 1;
            unacked[k] += 1;
            rr = (k + 1) % 3;
            next += 1;
        }
        let (got, other) = bed.take();
        assert!(other.is_empty(), "round {round}: {other:?}");
        assert_eq!(got, want, "round {round}");
        for &(_, e, _) in &got {
            assert!(seen.insert(e), "entry {e} delivered twice");
        }
        for (k, c) in cs.iter().enumerate() {
            assert_eq!(bed.permits(*c), permits[k], "round {round}: permits of consumer {k}");
        }
        // Ack a random part of what is held.
        let mut acked = Vec::new();
        held.retain(|&(e, k)| {
            let ack = rng.below(2) == 0;
            if ack {
                acked.push(e);
                unacked[k] -= 1;
            }
            !ack
        });
        bed.ack(&acked);
    }
    assert!(next > n / 4, "the test delivered too little to mean much ({next} of {n})");
}

/// Goal: Key_Shared keeps each key's order across a consumer joining and
/// leaving. When B joins, the keys it takes over wait until every entry
/// before its join point is acknowledged, then go to B in log order; when
/// B leaves, what it held goes back to A, in log order, counted as
/// redelivered. Method: alternate a low-hash and a high-hash key over 20
/// entries; A alone gets the first 10, B joins, the next 10 become
/// durable, and passes run around acks and B's leaving.
#[test]
fn key_shared_handover_when_a_consumer_joins_and_leaves() {
    let (low, high) = low_and_high_keys();
    let keys: Vec<&str> = (0..20).map(|i| if i % 2 == 0 { low.as_str() } else { high.as_str() }).collect();
    let bed = Bed::new(SubscriptionType::KeyShared, &keys, 10, 1000);
    let a = bed.join(1, "a", SubscriptionType::KeyShared, 100);
    bed.pass();
    let (got, _) = bed.take();
    assert_eq!(got, (0..10).map(|e| (1, e, 0)).collect::<Vec<_>>(), "A alone gets everything");

    let b = bed.join(2, "b", SubscriptionType::KeyShared, 100);
    bed.topic.durable_next.set(20);
    bed.pass();
    let (got, _) = bed.take();
    // Low keys stay with A; B's (high) keys wait behind A's unacked 1..9.
    assert_eq!(got, (10..20).step_by(2).map(|e| (1, e, 0)).collect::<Vec<_>>());
    assert_eq!(bed.sub.replay.borrow().keys().copied().collect::<Vec<_>>(), (11..20).step_by(2).collect::<Vec<_>>());

    // Acking all but entry 9 is not enough: 9 is a high key A still holds.
    bed.ack(&(0..9).collect::<Vec<_>>());
    bed.pass();
    assert_eq!(bed.take().0, vec![], "B waits for entry 9");
    bed.ack(&[9]);
    bed.pass();
    let (got, _) = bed.take();
    assert_eq!(got, (11..20).step_by(2).map(|e| (2, e, 0)).collect::<Vec<_>>(), "B gets its keys in order");

    bed.sub.remove_consumer(&bed.ctx.sink, b);
    bed.check_accounting();
    bed.pass();
    let (got, _) = bed.take();
    assert_eq!(got, (11..20).step_by(2).map(|e| (1, e, 1)).collect::<Vec<_>>(), "back to A, redelivered");
    assert_eq!(bed.sub.consumers.borrow()[0].unacked, 10);
    let _ = a;
}

/// Goal: on Failover, the standby takes over when the active consumer
/// leaves: it is told it is active, and gets what the old one held (in log
/// order, counted as redelivered) before anything new. Method: two
/// consumers, the first by name active; deliver, ack part, remove the
/// active one, pass again.
#[test]
fn failover_takeover() {
    let keys = vec![""; 12];
    let bed = Bed::new(SubscriptionType::Failover, &keys, 8, 1000);
    let a = bed.join(1, "a", SubscriptionType::Failover, 100);
    let b = bed.join(2, "b", SubscriptionType::Failover, 100);
    let (_, told) = bed.take();
    let told: Vec<(u64, bool)> = told
        .into_iter()
        .map(|ev| match ev {
            ConsumerEvent::ActiveChange { consumer_id, is_active } => (consumer_id, is_active),
            ev => panic!("unexpected {ev:?}"),
        })
        .collect();
    assert_eq!(told, vec![(1, true), (2, false)]);
    bed.pass();
    assert_eq!(bed.take().0, (0..8).map(|e| (1, e, 0)).collect::<Vec<_>>(), "only the active one gets entries");
    bed.ack(&[0, 1, 2]);

    bed.sub.remove_consumer(&bed.ctx.sink, a);
    bed.topic.durable_next.set(12);
    bed.pass();
    let (got, told) = bed.take();
    assert!(matches!(told[..], [ConsumerEvent::ActiveChange { consumer_id: 2, is_active: true }]), "{told:?}");
    let want: Vec<_> = (3..8).map(|e| (2, e, 1)).chain((8..12).map(|e| (2, e, 0))).collect();
    assert_eq!(got, want);
    assert_eq!(bed.permits(b), 100 - 9);
}

/// Goal: an entry's redelivery count is the number of times it was
/// delivered before, across redelivery requests and a consumer leaving,
/// and a changed count queues the state record. Method: one Shared
/// consumer; redeliver some, then all, ack one, then replace the consumer;
/// check each delivery's count.
#[test]
fn redelivery_counts() {
    let keys = vec![""; 6];
    let bed = Bed::new(SubscriptionType::Shared, &keys, 6, 1000);
    let c1 = bed.join(1, "c1", SubscriptionType::Shared, 1000);
    bed.pass();
    assert_eq!(bed.take().0, (0..6).map(|e| (1, e, 0)).collect::<Vec<_>>());
    assert!(!bed.sub.counts_dirty.get(), "first deliveries change no count");

    assert_eq!(bed.sub.redeliver(c1, &[1, 3]), 2);
    bed.pass();
    assert_eq!(bed.take().0, vec![(1, 1, 1), (1, 3, 1)]);
    assert!(bed.sub.counts_dirty.get(), "a redelivery queues the counts");

    assert_eq!(bed.sub.redeliver(c1, &[]), 6);
    bed.pass();
    assert_eq!(bed.take().0, vec![(1, 0, 1), (1, 1, 2), (1, 2, 1), (1, 3, 2), (1, 4, 1), (1, 5, 1)]);
    let redelivered = |name: &str| bed.sub.consumers.borrow().iter().find(|c| c.name == name).map(|c| c.redelivered);
    assert_eq!(redelivered("c1"), Some(8), "every delivery with a count above 0 is counted for its consumer");

    bed.ack(&[2]);
    bed.sub.remove_consumer(&bed.ctx.sink, c1);
    bed.check_accounting();
    assert_eq!(bed.sub.deliveries.borrow().len(), 5, "counts kept for the entries nobody holds");
    bed.join(2, "c2", SubscriptionType::Shared, 1000);
    bed.pass();
    assert_eq!(bed.take().0, vec![(2, 0, 2), (2, 1, 3), (2, 3, 3), (2, 4, 2), (2, 5, 2)]);
    assert!(bed.sub.deliveries.borrow().is_empty(), "held entries keep their count in pending");
    assert_eq!(redelivered("c2"), Some(5), "a new consumer's count starts at its own redeliveries");
}

/// Goal: a paused consumer (its connection has too much unwritten output)
/// gets nothing while paused, even with permits, and permits granted
/// meanwhile count once it resumes; another consumer is not held up.
/// Method: Shared, two consumers with 2 permits each over 8 entries; one
/// is paused, granted 3 more, passes run, then it resumes.
#[test]
fn a_paused_consumer_gets_nothing_until_it_resumes() {
    let keys = [""; 8];
    let bed = Bed::new(SubscriptionType::Shared, &keys, 8, 100);
    let slow = bed.join(1, "slow", SubscriptionType::Shared, 2);
    let other = bed.join(2, "other", SubscriptionType::Shared, 2);
    bed.sub.pause(slow, true);
    bed.sub.flow(slow, 3);
    assert_eq!(bed.permits(slow), 0, "a paused consumer keeps its permits aside");
    bed.pass();
    let (delivered, _) = bed.take();
    assert_eq!(delivered.iter().filter(|d| d.0 == 1).count(), 0, "delivered to a paused consumer: {delivered:?}");
    assert_eq!(delivered.iter().filter(|d| d.0 == 2).count(), 2, "{delivered:?}");
    bed.sub.pause(slow, true);
    bed.sub.pause(slow, false);
    assert_eq!(bed.permits(slow), 5, "the permits set aside and those granted while paused");
    bed.pass();
    let (delivered, _) = bed.take();
    assert_eq!(delivered.iter().filter(|d| d.0 == 1).count(), 5, "{delivered:?}");
    assert_eq!(bed.permits(other), 0);
}
