//! Messages as the application sees them: what it sends and what it receives.

use bytes::Bytes;
use magnetar_wire::{MessageId, MessageMetadata};
use std::sync::Arc;

/// A message to publish. Build it with [`OutgoingMessage::new`] and the
/// `with_*` methods:
///
/// ```
/// # use magnetar_client::OutgoingMessage;
/// let msg = OutgoingMessage::new("hello").with_key("k1").with_property("source", "doc");
/// assert_eq!(msg.key.as_deref(), Some("k1"));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutgoingMessage {
    pub payload: Bytes,
    /// Partition key (also the routing key for Key_Shared subscriptions).
    pub key: Option<String>,
    /// Application properties, in order; duplicate names are kept as given.
    pub properties: Vec<(String, String)>,
    /// Application event time, milliseconds since the Unix epoch.
    pub event_time_ms: Option<u64>,
    /// Sequence id to send with (default: the producer's next). Must be above
    /// every sequence id of this producer still awaiting its receipt; with
    /// broker dedup on, a resend of an id already stored is not stored again.
    pub sequence_id: Option<u64>,
    /// Delayed delivery: consumers get it no earlier than this time,
    /// milliseconds since the Unix epoch.
    pub deliver_at_ms: Option<u64>,
    /// RocketMQ-style tag, for subscriptions with a tag filter.
    pub tag: Option<String>,
}

impl OutgoingMessage {
    pub fn new(payload: impl Into<Bytes>) -> Self {
        Self { payload: payload.into(), ..Self::default() }
    }

    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    pub fn with_property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.push((name.into(), value.into()));
        self
    }

    pub fn with_properties<I, K, V>(mut self, props: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.properties.extend(props.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    pub fn with_sequence_id(mut self, sequence_id: u64) -> Self {
        self.sequence_id = Some(sequence_id);
        self
    }

    pub fn with_event_time_ms(mut self, event_time_ms: u64) -> Self {
        self.event_time_ms = Some(event_time_ms);
        self
    }

    /// Deliver no earlier than `deliver_at_ms` (milliseconds since the Unix epoch).
    pub fn with_deliver_at_ms(mut self, deliver_at_ms: u64) -> Self {
        self.deliver_at_ms = Some(deliver_at_ms);
        self
    }

    /// Deliver no earlier than `delay` from now (by this machine's clock).
    pub fn with_deliver_after(self, delay: std::time::Duration) -> Self {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let at = now.saturating_add(delay).as_millis();
        self.with_deliver_at_ms(u64::try_from(at).unwrap_or(u64::MAX))
    }

    pub fn with_tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }
}

/// A received message. `payload` is a slice of the connection's receive
/// buffer (not copied).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub id: MessageId,
    /// Full topic name (`persistent://tenant/ns/topic`); shared by every
    /// message of the consumer (no copy per message).
    pub topic: Arc<str>,
    pub metadata: MessageMetadata,
    pub payload: Bytes,
    /// How many times the broker delivered this message before (0 on first delivery).
    pub redelivery_count: u32,
    /// A message of a batch redelivered after some of its siblings were
    /// acknowledged: bit i (of word i / 64) set = message i of the batch was
    /// acknowledged and is not handed out again. Empty otherwise.
    pub ack_set: Vec<u64>,
}

impl Message {
    pub fn id(&self) -> MessageId {
        self.id
    }

    /// Full topic name (a partition's own name for a partitioned topic).
    pub fn topic(&self) -> &str {
        &self.topic
    }

    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    pub fn key(&self) -> Option<&str> {
        self.metadata.partition_key.as_deref()
    }

    pub fn properties(&self) -> &[(String, String)] {
        &self.metadata.properties
    }

    /// The first property with this name.
    pub fn property(&self, name: &str) -> Option<&str> {
        self.metadata.properties.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// When the producer sent it, milliseconds since the Unix epoch.
    pub fn publish_time_ms(&self) -> u64 {
        self.metadata.publish_time_ms
    }

    /// The application's event time, if the producer set one.
    pub fn event_time_ms(&self) -> Option<u64> {
        (self.metadata.event_time_ms != 0).then_some(self.metadata.event_time_ms)
    }

    pub fn producer_name(&self) -> &str {
        &self.metadata.producer_name
    }

    pub fn sequence_id(&self) -> u64 {
        self.metadata.sequence_id
    }

    pub fn redelivery_count(&self) -> u32 {
        self.redelivery_count
    }

    pub fn tag(&self) -> Option<&str> {
        self.metadata.tag.as_deref()
    }

    /// When the producer asked it to be delivered, if it is a delayed message.
    pub fn deliver_at_ms(&self) -> Option<u64> {
        (self.metadata.deliver_at_ms != 0).then_some(self.metadata.deliver_at_ms)
    }
}
