//! Helpers shared by the core integration tests.

use magnetar_core::SubscribeRequest;
use magnetar_wire::{InitialPosition, SubscriptionType};

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
    }
}
