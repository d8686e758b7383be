//! A consumer's queue, as the consumer reads it: the entries its
//! connection slot queued, unpacked one at a time as they are taken off
//! (`unpack`), so that a batch or a run costs one queue item and the
//! unpacking is done by the task that receives, on its way out.

use super::unpack::{unpack_entry, Unpacked};
use crate::conn::demux::{Inbound, Queued};
use crate::error::Result;
use crate::message::Message;
use bytes::Bytes;
use magnetar_wire::MessageId;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A message on its way to the application, or why one entry could not be
/// read (that message's error; the next one goes on).
pub(crate) type Delivery = Result<Message>;

/// What is left of the queue item taken off last: the messages of the
/// batch entry being handed out, then the entries not unpacked yet.
/// Handed out, in order, before the next item.
#[derive(Default)]
pub(crate) struct Unpacking {
    batch: std::vec::IntoIter<Message>,
    /// A `Message` frame's entry (no list for one entry).
    one: Option<(MessageId, Bytes)>,
    /// A `MessageRun`'s entries.
    run: std::vec::IntoIter<(MessageId, Bytes)>,
    /// What the entries share.
    topic: Arc<str>,
    redelivery_count: u32,
    /// A redelivered batch's messages acknowledged before (only a lone
    /// entry has them).
    ack_set: Vec<u64>,
    /// Why the broker closed the consumer, handed out after the entries.
    failed: Option<crate::error::ClientError>,
}

impl Unpacking {
    /// Whether nothing is left.
    pub(crate) fn is_empty(&self) -> bool {
        self.batch.len() == 0 && self.one.is_none() && self.run.len() == 0 && self.failed.is_none()
    }

    /// Takes on the entries of `item`; gives back an item that holds none
    /// (`End`, `Joined`). Only when empty: what was left would be lost.
    pub(crate) fn load(&mut self, item: Inbound) -> Option<Inbound> {
        assert!(self.is_empty(), "a queue item taken off before the last one was handed out");
        match item {
            Inbound::Entry { topic, id, redelivery_count, ack_set, blob } => {
                self.one = Some((id, blob));
                self.topic = topic;
                self.redelivery_count = redelivery_count;
                self.ack_set = ack_set;
                None
            }
            Inbound::Run { topic, redelivery_count, entries } => {
                self.run = entries;
                self.topic = topic;
                self.redelivery_count = redelivery_count;
                None
            }
            Inbound::Failed(e) => {
                self.failed = Some(e);
                None
            }
            marker @ (Inbound::End | Inbound::Joined) => Some(marker),
        }
    }

    /// The next delivery, unpacking the next entry when the batch at hand
    /// is done. An entry that holds nothing (a batch whose every message was
    /// acknowledged) is skipped.
    pub(crate) fn next(&mut self) -> Option<Delivery> {
        if let Some(m) = self.batch.next() {
            return Some(Ok(m));
        }
        loop {
            let (id, blob) = match self.one.take() {
                Some(entry) => entry,
                None => match self.run.next() {
                    Some(entry) => entry,
                    None => return self.failed.take().map(Err),
                },
            };
            let ack_set = std::mem::take(&mut self.ack_set);
            match unpack_entry(blob, id, &self.topic, self.redelivery_count, ack_set) {
                Ok(Unpacked::One(m)) => return Some(Ok(m)),
                Ok(Unpacked::Batch(messages)) => {
                    self.batch = messages.into_iter();
                    if let Some(m) = self.batch.next() {
                        return Some(Ok(m));
                    }
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// A consumer's own queue: the channel, and what is left of the item taken
/// off it last (handed out before anything else).
pub(crate) struct OwnQueue {
    pub(super) rx: mpsc::UnboundedReceiver<Queued>,
    pub(super) rest: Unpacking,
}

impl OwnQueue {
    pub(super) fn new(rx: mpsc::UnboundedReceiver<Queued>) -> Self {
        Self { rx, rest: Unpacking::default() }
    }

    /// Takes on `item`: `rest` then hands out its messages. (`End` needs no
    /// handling: the queue closes once the retry topic's slot is gone too.)
    /// Returns the entries it holds (the flow permits they took).
    pub(super) fn load(&mut self, item: Inbound) -> u32 {
        let entries = match &item {
            Inbound::Entry { .. } => 1,
            Inbound::Run { entries, .. } => u32::try_from(entries.len()).unwrap_or(u32::MAX),
            _ => 0,
        };
        let _marker = self.rest.load(item);
        entries
    }

    /// Drops what is queued, unpacked: calls `dropped` for each delivery.
    /// Returns the entries taken off the channel.
    pub(super) fn drain(&mut self, mut dropped: impl FnMut(&Delivery)) -> u32 {
        let mut entries = 0u32;
        loop {
            while let Some(d) = self.rest.next() {
                dropped(&d);
            }
            match self.rx.try_recv() {
                Ok(queued) => entries = entries.saturating_add(self.load(queued.item)),
                Err(_) => return entries,
            }
        }
    }

    /// Drops what is queued, without unpacking it.
    pub(super) fn discard(&mut self) {
        self.rest = Unpacking::default();
        while self.rx.try_recv().is_ok() {}
    }
}

/// Where a consumer's messages wait for the application.
#[allow(clippy::large_enum_variant, reason = "one per consumer; a box would cost an indirection per receive")]
pub(super) enum Queue {
    /// A queue of its own, read by `receive`.
    Own(tokio::sync::Mutex<OwnQueue>),
    /// A member of a multi-topic consumer: its messages wait in the shared
    /// queue, and the multi-topic consumer hands each to `accept`.
    Shared,
}

#[cfg(test)]
mod tests {
    // Test code: unwrap on our own encoder's output is the assertion.
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::error::ClientError;
    use bytes::BytesMut;
    use magnetar_wire::{encode_batch_record_into, encode_message, BatchMessage, MessageMetadata};

    fn plain(text: &str) -> Bytes {
        encode_message(
            &MessageMetadata { producer_name: "p".into(), num_messages: 1, ..Default::default() },
            text.as_bytes(),
        )
    }

    fn batch(texts: &[&str]) -> Bytes {
        let mut payload = BytesMut::new();
        for (i, t) in texts.iter().enumerate() {
            let record = BatchMessage {
                sequence_id: i as u64,
                payload: Bytes::copy_from_slice(t.as_bytes()),
                ..Default::default()
            };
            encode_batch_record_into(&record, &mut payload);
        }
        let metadata =
            MessageMetadata { producer_name: "p".into(), num_messages: texts.len() as u32, ..Default::default() };
        encode_message(&metadata, &payload)
    }

    fn id(entry: u64) -> MessageId {
        MessageId::new(1, entry, -1, -1)
    }

    /// What `next` hands out until it is empty: each message's text and id,
    /// or "error".
    fn drain(u: &mut Unpacking) -> Vec<(String, MessageId)> {
        let mut out = Vec::new();
        while let Some(d) = u.next() {
            out.push(match d {
                Ok(m) => (String::from_utf8(m.payload.to_vec()).unwrap(), m.id),
                Err(ClientError::Wire(_)) => ("error".to_string(), MessageId::new(0, 0, -1, -1)),
                Err(e) => panic!("unexpected error {e}"),
            });
        }
        assert!(u.is_empty());
        out
    }

    /// Goal: entries unpacked as they are taken off the queue come out in
    /// the broker's order, one message each: a run's entries in order, a batch
    /// split into its messages (numbered by batch index), a bad entry as
    /// that message's error with the run going on after it, a redelivered
    /// batch without its acknowledged messages, a wholly acknowledged batch
    /// as nothing, and `End`/`Joined` given back untouched.
    #[test]
    fn entries_unpack_in_order_as_they_are_taken() {
        let topic: Arc<str> = "persistent://public/default/t".into();
        let mut u = Unpacking::default();
        let entries = vec![
            (id(1), plain("a")),
            (id(2), batch(&["b0", "b1", "b2"])),
            (id(3), plain("x").slice(..5)),
            (id(4), plain("c")),
        ];
        assert!(u
            .load(Inbound::Run { topic: topic.clone(), redelivery_count: 0, entries: entries.into_iter() })
            .is_none());
        let batch_id = |i| MessageId { batch_index: i, ..id(2) };
        let want = [("a", id(1)), ("b0", batch_id(0)), ("b1", batch_id(1)), ("b2", batch_id(2))];
        let got = drain(&mut u);
        assert_eq!(got[..4], want.map(|(t, i)| (t.to_string(), i)));
        assert_eq!(got[4].0, "error");
        assert_eq!(got[5], ("c".to_string(), id(4)));
        assert_eq!(got.len(), 6);

        // Indexes 0 and 2 acknowledged before the redelivery.
        let entry = |ack_set| Inbound::Entry {
            topic: topic.clone(),
            id: id(2),
            redelivery_count: 1,
            ack_set,
            blob: batch(&["b0", "b1", "b2"]),
        };
        assert!(u.load(entry(vec![0b101])).is_none());
        assert_eq!(drain(&mut u), vec![("b1".to_string(), batch_id(1))]);
        assert!(u.load(entry(vec![0b111])).is_none());
        assert_eq!(drain(&mut u), vec![]);

        assert!(matches!(u.load(Inbound::End), Some(Inbound::End)));
        assert!(matches!(u.load(Inbound::Joined), Some(Inbound::Joined)));
        assert!(u.is_empty());
    }
}
