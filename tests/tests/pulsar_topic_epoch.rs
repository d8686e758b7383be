//! Goal: PRODUCER_SUCCESS carries Pulsar's `topic_epoch` for exclusive
//! producers (issue #19): each exclusive producer that takes a topic
//! (Exclusive, ExclusiveWithFencing, WaitForExclusive when its turn comes)
//! moves the epoch on; a producer that comes back naming an epoch the topic
//! has moved past (another exclusive producer held it in between) is
//! refused with ProducerFenced, one naming the current epoch is admitted;
//! the epoch survives a restart. The C++ client keeps the epoch and names it
//! when it reconnects, but shows it nowhere, so this is tested with raw
//! frames.
//!
//! Method: one broker; each producer on its own raw TCP connection (CONNECT,
//! PRODUCER, read the answer); then a restart on the same data directory.

use magnetar_pulsar_wire::proto::{CommandProducer, ProducerAccessMode, ServerError};
use magnetar_pulsar_wire::Frame;
use magnetar_tests::pulsar_raw::RawPulsar;
use magnetar_tests::{test_dir, BrokerProcess};
use std::time::Duration;

const TOPIC: &str = "persistent://public/default/epoch";

/// One raw Pulsar connection with one producer (id 1).
struct Conn(RawPulsar);

impl Conn {
    fn open(addr: &str) -> Conn {
        Conn(RawPulsar::open(addr, "raw-epoch-test", true, Duration::from_millis(200)))
    }

    fn next(&mut self) -> Frame {
        self.0.next_frame()
    }

    /// Sends PRODUCER (id 1, request 1) named `name`.
    fn ask_producer(&mut self, name: &str, mode: ProducerAccessMode, epoch: Option<u64>) {
        self.0.ask_producer(CommandProducer {
            topic: TOPIC.into(),
            producer_id: 1,
            request_id: 1,
            producer_name: Some(name.into()),
            producer_access_mode: Some(mode as i32),
            topic_epoch: epoch,
            ..Default::default()
        });
    }

    /// PRODUCER and its answer: `Ok(topic_epoch)` or `Err(server error)`.
    fn producer(&mut self, name: &str, mode: ProducerAccessMode, epoch: Option<u64>) -> Result<Option<u64>, i32> {
        self.ask_producer(name, mode, epoch);
        answer(&self.next())
    }

    fn close_producer(&mut self) {
        self.0.close_producer(1, 2);
    }
}

fn answer(f: &Frame) -> Result<Option<u64>, i32> {
    if let Some(s) = &f.command.producer_success {
        assert_eq!(s.producer_ready, Some(true), "{:?}", f.command);
        return Ok(s.topic_epoch);
    }
    match &f.command.error {
        Some(e) => Err(e.error),
        None => panic!("not an answer to PRODUCER: {:?}", f.command),
    }
}

#[test]
fn pulsar_topic_epoch() {
    use ProducerAccessMode::{Exclusive, ExclusiveWithFencing, Shared, WaitForExclusive};
    let fenced = Err(ServerError::ProducerFenced as i32);
    let dir = test_dir("pulsar-topic-epoch");
    let mut broker = BrokerProcess::start(dir.path(), 1);
    let addr = broker.url();

    // No exclusive producer yet: a shared one is told no epoch.
    let mut s = Conn::open(&addr);
    assert_eq!(s.producer("s", Shared, None), Ok(None));
    s.close_producer();

    let mut a = Conn::open(&addr);
    assert_eq!(a.producer("a", Exclusive, None), Ok(Some(0)));
    a.close_producer();
    let mut b = Conn::open(&addr);
    assert_eq!(b.producer("b", Exclusive, None), Ok(Some(1)));
    b.close_producer();
    // `a` comes back with its epoch: `b` held the topic since.
    assert_eq!(a.producer("a", Exclusive, Some(0)), fenced);
    assert_eq!(a.producer("a", ExclusiveWithFencing, Some(0)), fenced);
    // `b` comes back with the current one.
    assert_eq!(b.producer("b", Exclusive, Some(1)), Ok(Some(1)));

    // A fencing producer takes it from `b`; a waiting one gets the next
    // epoch when its turn comes (after `producer_ready = false`).
    let mut f = Conn::open(&addr);
    assert_eq!(f.producer("f", ExclusiveWithFencing, None), Ok(Some(2)));
    let mut w = Conn::open(&addr);
    w.ask_producer("w", WaitForExclusive, None);
    let queued = w.next();
    assert_eq!(queued.command.producer_success.as_ref().and_then(|p| p.producer_ready), Some(false));
    f.close_producer();
    assert_eq!(answer(&w.next()), Ok(Some(3)));
    // A shared producer is refused beside it; once it is gone, one is
    // told the current epoch, which it leaves as it is.
    assert_eq!(s.producer("s", Shared, None), Err(ServerError::ProducerBusy as i32));
    w.close_producer();
    assert_eq!(s.producer("s", Shared, None), Ok(Some(3)));
    s.close_producer();
    drop((a, b, f, w, s));

    // The epoch is durable.
    broker.terminate();
    let mut broker = broker.restart();
    let addr = broker.url();
    let mut d = Conn::open(&addr);
    assert_eq!(d.producer("d", Exclusive, Some(2)), fenced);
    assert_eq!(d.producer("d", Exclusive, None), Ok(Some(4)));
    broker.assert_running();
    assert!(!broker.log().contains("panicked"), "{}", broker.log_tail());
}
