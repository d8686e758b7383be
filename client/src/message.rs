//! Messages as the application sees them: what it sends and what it receives.

use bytes::Bytes;
use magnetar_wire::{MessageId, MessageMetadata, MessageView};
use std::sync::{Arc, OnceLock};

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
///
/// What the producer put in the entry (producer name, publish time, tag,
/// delivery time, batch size) is shared by the messages of a batch: one
/// reference-counted [`MessageMetadata`] per entry, not a copy per message.
/// A batch message's own fields (key, ordering key, properties, event time,
/// sequence id) are its record's; read them through the accessors.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub id: MessageId,
    /// Full topic name (`persistent://tenant/ns/topic`); shared by every
    /// message of the consumer (no copy per message).
    pub topic: Arc<str>,
    pub payload: Bytes,
    /// How many times the broker delivered this message before (0 on first delivery).
    pub redelivery_count: u32,
    /// A message of a batch redelivered after some of its siblings were
    /// acknowledged: bit i (of word i / 64) set = message i of the batch was
    /// acknowledged and is not handed out again. Empty otherwise.
    pub ack_set: Vec<u64>,
    /// The entry's metadata (shared by a batch's messages), and a batch
    /// message's own fields.
    pub(crate) entry: Entry,
}

/// Where a received message's metadata is.
#[derive(Clone)]
pub(crate) enum Entry {
    /// Decoded: a chunk, a reassembled chunked message, a message built by
    /// hand.
    Decoded(Arc<MessageMetadata>),
    /// A message of a batch: the entry's metadata, shared with its
    /// siblings, and its record's fields.
    Batched(Arc<MessageMetadata>, Record),
    /// A whole entry as it came (not a batch, not a chunk): its blob,
    /// checked whole by `view_message` on arrival, and the owned metadata,
    /// decoded from it on first use only (`entry_metadata`, or a field of
    /// metadata too large to read again per accessor). The common case of
    /// a consumer that reads payloads: no allocation per message (issue #6).
    Blob(Bytes, OnceLock<Arc<MessageMetadata>>),
}

/// Up to this many metadata bytes, a blob entry's accessors read the blob
/// again (checked: a few tens of ns) rather than decode it (allocating);
/// beyond, or once decoded, they read the decoded metadata.
const REREAD_BYTES_MAX: u32 = 256;

impl Entry {
    /// The blob's view, when reading the blob again is the cheap way to a
    /// field: a blob entry with small metadata not decoded yet. The blob
    /// was checked on arrival and is immutable, so this succeeds again;
    /// were it ever to fail, the decoded metadata (then empty) answers.
    fn quick_view(&self) -> Option<MessageView<'_>> {
        let Entry::Blob(blob, cell) = self else { return None };
        let metadata_len = u32::from_le_bytes(blob.get(..4)?.try_into().ok()?);
        if cell.get().is_some() || metadata_len > REREAD_BYTES_MAX {
            return None;
        }
        magnetar_wire::view_message(blob).ok()
    }

    pub(crate) fn metadata(&self) -> &MessageMetadata {
        match self {
            Entry::Decoded(m) | Entry::Batched(m, _) => m,
            Entry::Blob(blob, cell) => cell.get_or_init(|| {
                let mut m = magnetar_wire::view_message(blob).map(|v| v.to_metadata(blob)).unwrap_or_default();
                // The payload was decompressed on arrival.
                m.compression = magnetar_wire::CompressionType::None;
                Arc::new(m)
            }),
        }
    }

    fn record(&self) -> Option<&Record> {
        match self {
            Entry::Batched(_, r) => Some(r),
            _ => None,
        }
    }

    /// Of a chunked message (a blob entry never is).
    pub(crate) fn is_chunk(&self) -> bool {
        match self {
            Entry::Decoded(m) | Entry::Batched(m, _) => m.chunk.is_some(),
            Entry::Blob(..) => false,
        }
    }

    /// Messages in the entry.
    pub(crate) fn num_messages(&self) -> u32 {
        match self.quick_view() {
            Some(v) => v.num_messages,
            None => self.metadata().num_messages,
        }
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Entry");
        d.field("metadata", self.metadata());
        if let Some(r) = self.record() {
            d.field("record", r);
        }
        d.finish()
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        matches!(self, Entry::Batched(..)) == matches!(other, Entry::Batched(..))
            && self.record() == other.record()
            && self.metadata() == other.metadata()
    }
}

/// A batch message's own fields.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Record {
    /// Its key, ordering key and properties (`None` when it has none).
    /// Boxed: most messages have none, and a `Message` is moved through the
    /// consumer's queue by value.
    pub(crate) fields: Option<Box<RecordFields>>,
    pub(crate) sequence_id: u64,
    pub(crate) event_time_ms: u64,
}

/// A batch message's own variable-length fields.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct RecordFields {
    pub(crate) partition_key: Option<String>,
    pub(crate) ordering_key: Option<Bytes>,
    pub(crate) properties: Vec<(String, String)>,
}

impl Message {
    /// A message that is a whole entry (not of a batch), e.g. for tests of
    /// code that consumes messages.
    pub fn new(id: MessageId, topic: impl Into<Arc<str>>, metadata: MessageMetadata, payload: Bytes) -> Self {
        Self::of_entry(id, topic.into(), Arc::new(metadata), payload, 0)
    }

    pub(crate) fn of_entry(
        id: MessageId,
        topic: Arc<str>,
        entry: Arc<MessageMetadata>,
        payload: Bytes,
        redelivery_count: u32,
    ) -> Self {
        Self { id, topic, payload, redelivery_count, ack_set: Vec::new(), entry: Entry::Decoded(entry) }
    }

    /// A whole entry (not a batch, not a chunk): `blob`, checked by
    /// `view_message`; `payload` is its payload, decompressed.
    pub(crate) fn of_blob(id: MessageId, topic: Arc<str>, blob: Bytes, payload: Bytes, redelivery_count: u32) -> Self {
        Self { id, topic, payload, redelivery_count, ack_set: Vec::new(), entry: Entry::Blob(blob, OnceLock::new()) }
    }

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

    /// The metadata of the entry this message came in: for a message of a
    /// batch, its key, ordering key, properties, event time and sequence id
    /// there are not its own (use [`Message::key`] and the other accessors).
    pub fn entry_metadata(&self) -> &MessageMetadata {
        self.entry.metadata()
    }

    pub fn key(&self) -> Option<&str> {
        if let Entry::Batched(_, r) = &self.entry {
            return r.fields.as_ref().and_then(|r| r.partition_key.as_deref());
        }
        match self.entry.quick_view() {
            Some(v) => v.partition_key,
            None => self.entry.metadata().partition_key.as_deref(),
        }
    }

    pub fn ordering_key(&self) -> Option<&Bytes> {
        if let Entry::Batched(_, r) = &self.entry {
            return r.fields.as_ref().and_then(|r| r.ordering_key.as_ref());
        }
        if self.entry.quick_view().is_some_and(|v| v.ordering_key.is_none()) {
            return None;
        }
        self.entry.metadata().ordering_key.as_ref()
    }

    pub fn properties(&self) -> &[(String, String)] {
        if let Entry::Batched(_, r) = &self.entry {
            return r.fields.as_ref().map_or(&[], |r| r.properties.as_slice());
        }
        if self.entry.quick_view().is_some_and(|v| v.properties.is_empty()) {
            return &[];
        }
        &self.entry.metadata().properties
    }

    /// The first property with this name.
    pub fn property(&self, name: &str) -> Option<&str> {
        if let Some(v) = self.entry.quick_view() {
            return v.properties.iter().find(|(k, _)| *k == name).map(|(_, v)| v);
        }
        self.properties().iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// When the producer sent it, milliseconds since the Unix epoch.
    pub fn publish_time_ms(&self) -> u64 {
        match self.entry.quick_view() {
            Some(v) => v.publish_time_ms,
            None => self.entry.metadata().publish_time_ms,
        }
    }

    /// The application's event time, if the producer set one.
    pub fn event_time_ms(&self) -> Option<u64> {
        let at = match (&self.entry, self.entry.quick_view()) {
            (Entry::Batched(_, r), _) => r.event_time_ms,
            (_, Some(v)) => v.event_time_ms,
            (entry, None) => entry.metadata().event_time_ms,
        };
        (at != 0).then_some(at)
    }

    pub fn producer_name(&self) -> &str {
        match self.entry.quick_view() {
            Some(v) => v.producer_name,
            None => &self.entry.metadata().producer_name,
        }
    }

    pub fn sequence_id(&self) -> u64 {
        match (&self.entry, self.entry.quick_view()) {
            (Entry::Batched(_, r), _) => r.sequence_id,
            (_, Some(v)) => v.sequence_id,
            (entry, None) => entry.metadata().sequence_id,
        }
    }

    pub fn redelivery_count(&self) -> u32 {
        self.redelivery_count
    }

    pub fn tag(&self) -> Option<&str> {
        match self.entry.quick_view() {
            Some(v) => v.tag,
            None => self.entry.metadata().tag.as_deref(),
        }
    }

    /// When the producer asked it to be delivered, if it is a delayed message.
    pub fn deliver_at_ms(&self) -> Option<u64> {
        let at = match self.entry.quick_view() {
            Some(v) => v.deliver_at_ms,
            None => self.entry.metadata().deliver_at_ms,
        };
        (at != 0).then_some(at)
    }

    /// Messages in the entry this message came in (1 unless batched).
    pub fn batch_size(&self) -> u32 {
        self.entry.num_messages()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_received_message_stays_small() {
        // It is moved by value through the consumer's queue per message.
        assert!(std::mem::size_of::<Message>() <= 160, "{}", std::mem::size_of::<Message>());
        println!("Message: {} bytes", std::mem::size_of::<Message>());
    }
}
