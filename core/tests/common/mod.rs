//! Helpers shared by the core integration tests.

use magnetar_core::{Broker, BrokerConfig, SubscribeRequest};
use magnetar_wire::{InitialPosition, SubscriptionType};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// A durable Exclusive subscription `s` from the earliest entry, consumer 1.
pub fn exclusive_from_earliest(topic: &str) -> SubscribeRequest {
    SubscribeRequest {
        topic: topic.into(),
        subscription: "s".into(),
        consumer_id: 1,
        sub_type: SubscriptionType::Exclusive,
        consumer_name: "c".into(),
        initial_position: InitialPosition::Earliest,
        durable: true,
        priority_level: 0,
        filter_tag: String::new(),
        key_shared_ranges: Vec::new(),
        model: Default::default(),
        client_address: String::new(),
    }
}

/// Runs `scenario` on shard 0 of a fresh broker made from `config`, then
/// shuts the broker down; fails if the scenario panics (at once, not after
/// the timeout) or takes over 60 s.
#[allow(dead_code)] // not every test file runs scenarios
pub fn run_on_shard0<F, Fut>(config: BrokerConfig, scenario: F)
where
    F: Fn(Broker) -> Fut + Send + Clone + Sync + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    /// Says `false` when dropped before `finished`: the scenario panicked.
    struct Outcome(Option<mpsc::Sender<bool>>);
    impl Outcome {
        fn finished(mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(true);
            }
        }
    }
    impl Drop for Outcome {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(false);
            }
        }
    }
    let shutdown = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel();
    let running = magnetar_core::launch(config, shutdown.clone(), move |broker: Broker| {
        let scenario = scenario.clone();
        let done_tx = done_tx.clone();
        async move {
            if broker.shard_id() == 0 {
                let outcome = Outcome(Some(done_tx));
                scenario(broker).await;
                outcome.finished();
            }
            std::future::pending::<()>().await
        }
    })
    .expect("broker starts");
    let r = done_rx.recv_timeout(Duration::from_secs(60));
    shutdown.store(true, Ordering::SeqCst);
    let joined = running.join();
    match r {
        Ok(true) => {}
        Ok(false) | Err(mpsc::RecvTimeoutError::Disconnected) => panic!("scenario failed (see the panic above)"),
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("scenario timed out after 60 s"),
    }
    joined.expect("broker shuts down");
}
