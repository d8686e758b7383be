//! An entry's frame, built in place around its payload: the payload is
//! copied once, into a buffer with room before it for the message metadata
//! and the frame head.

use crate::error::Result;
use crate::message::OutgoingMessage;
use bytes::{Buf, Bytes, BytesMut};
use magnetar_wire::{encode_frame_head, encode_message_into, Command, MessageMetadata};

/// Bytes left free before an entry's payload for the frame head (about 70
/// bytes for a `Send`), the message header and the fixed part of its
/// metadata; `ProducerCore::headroom` adds the names, keys and properties.
pub(super) const ENTRY_HEADROOM_BYTES: usize = 320;

/// Flatbuffer bytes a string costs beyond its characters (length, NUL, padding).
const STRING_OVERHEAD_BYTES: usize = 8;
/// ... and a property beyond its name and value (its table and offsets).
const PROPERTY_OVERHEAD_BYTES: usize = 32;

/// The variable-length bytes `msg` puts in an entry's metadata.
pub(crate) fn metadata_variable_bytes(msg: &OutgoingMessage) -> usize {
    let s = |v: &Option<String>| v.as_ref().map_or(0, |v| v.len().saturating_add(STRING_OVERHEAD_BYTES));
    msg.properties.iter().fold(s(&msg.key).saturating_add(s(&msg.tag)), |a, (k, v)| {
        a.saturating_add(k.len()).saturating_add(v.len()).saturating_add(PROPERTY_OVERHEAD_BYTES)
    })
}

/// An entry's payload in the buffer its frame is built in: `buf[start..]` is
/// the payload, `buf[..start]` is left free, so that the message metadata
/// and the frame head go in front of the payload and the payload is copied
/// once (into this buffer) on its way to the socket.
pub(crate) struct EntryBody {
    buf: BytesMut,
    start: usize,
}

impl EntryBody {
    /// An empty payload with `headroom` free bytes before it and room for
    /// `payload_bytes` after.
    pub(crate) fn with_capacity(headroom: usize, payload_bytes: usize) -> Self {
        let mut buf = BytesMut::with_capacity(headroom.saturating_add(payload_bytes));
        buf.resize(headroom, 0);
        Self { buf, start: headroom }
    }

    pub(crate) fn copy_of(payload: &[u8], headroom: usize) -> Self {
        let mut body = Self::with_capacity(headroom, payload.len());
        body.buf.extend_from_slice(payload);
        body
    }

    /// The buffer to append payload bytes to (only append: what lies before
    /// the end belongs to the body).
    pub(crate) fn tail(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    pub(crate) fn payload(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }

    /// The frame of `command` carrying the message blob (`metadata` and this
    /// payload), built in place; refuses a frame above `max_frame_bytes` (as
    /// the broker would).
    pub(super) fn into_frame(
        self,
        command: &Command,
        metadata: &MessageMetadata,
        max_frame_bytes: u32,
    ) -> Result<Bytes> {
        let Self { buf, start } = self;
        let (frame, blob_len) = match frame_in_place(buf, start, command, metadata)? {
            Ok(framed) => framed,
            Err(buf) => {
                // The metadata did not fit before the payload: copy it all.
                let payload = buf.get(start..).unwrap_or_default();
                let mut blob = BytesMut::with_capacity(payload.len().saturating_add(ENTRY_HEADROOM_BYTES));
                encode_message_into(metadata, payload, &mut blob);
                let mut frame = BytesMut::with_capacity(blob.len().saturating_add(ENTRY_HEADROOM_BYTES));
                magnetar_wire::encode_frame(command, &blob, &mut frame)?;
                (frame.freeze(), blob.len())
            }
        };
        crate::conn::check_frame_size(&frame, blob_len, max_frame_bytes)?;
        Ok(frame)
    }
}

/// Puts the message header and metadata, then the frame head, into the free
/// bytes before the payload at `buf[start..]`: the frame and the length of
/// its message blob. Gives `buf` back untouched past `start` when they do
/// not fit.
fn frame_in_place(
    mut buf: BytesMut,
    start: usize,
    command: &Command,
    metadata: &MessageMetadata,
) -> Result<std::result::Result<(Bytes, usize), BytesMut>> {
    let mut prefix = BytesMut::with_capacity(ENTRY_HEADROOM_BYTES);
    encode_message_into(metadata, &[], &mut prefix);
    let Some(blob_at) = start.checked_sub(prefix.len()) else { return Ok(Err(buf)) };
    buf[blob_at..start].copy_from_slice(&prefix);
    let mut head = prefix;
    head.clear();
    // The head's checksum covers the blob, which is now whole in `buf`.
    encode_frame_head(command, &buf[blob_at..], &mut head)?;
    let Some(frame_at) = blob_at.checked_sub(head.len()) else { return Ok(Err(buf)) };
    buf[frame_at..blob_at].copy_from_slice(&head);
    let blob_len = buf.len() - blob_at;
    buf.advance(frame_at);
    Ok(Ok((buf.freeze(), blob_len)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ClientError;

    /// The frame as built before frames were built in place: blob, then frame.
    fn frame_by_copies(command: &Command, metadata: &MessageMetadata, payload: &[u8]) -> Bytes {
        let blob = magnetar_wire::encode_message(metadata, payload);
        let mut frame = BytesMut::new();
        magnetar_wire::encode_frame(command, &blob, &mut frame).unwrap_or_else(|e| panic!("{e}"));
        frame.freeze()
    }

    /// Goal: a frame built in place (metadata and head put before the
    /// payload) is byte for byte the frame built by copying, whether the
    /// headroom fits (in place) or not (the copying fallback), and the frame
    /// limit still refuses what is too large. Method: a small and a large
    /// metadata (long name, key, properties) with headroom 0, just the
    /// default, and the computed one.
    #[test]
    fn frames_built_in_place_match_frames_built_by_copying() {
        let payload: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let small = MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 7,
            publish_time_ms: 1_700_000_000_000,
            num_messages: 1,
            uncompressed_size: 3000,
            ..MessageMetadata::default()
        };
        let large = MessageMetadata {
            producer_name: "n".repeat(700),
            partition_key: Some("k".repeat(900)),
            properties: (0..20).map(|i| (format!("name{i}"), "v".repeat(40))).collect(),
            tag: Some("t".into()),
            ..small.clone()
        };
        let command = Command::Send { producer_id: 3, sequence_id: 7, num_messages: 1 };
        for metadata in [&small, &large] {
            let expected = frame_by_copies(&command, metadata, &payload);
            let variable = metadata.producer_name.len()
                + metadata.partition_key.as_ref().map_or(0, |k| k.len() + STRING_OVERHEAD_BYTES)
                + metadata.properties.iter().map(|(k, v)| k.len() + v.len() + PROPERTY_OVERHEAD_BYTES).sum::<usize>()
                + metadata.tag.as_ref().map_or(0, |t| t.len() + STRING_OVERHEAD_BYTES);
            for headroom in [0, ENTRY_HEADROOM_BYTES, ENTRY_HEADROOM_BYTES + variable] {
                let body = EntryBody::copy_of(&payload, headroom);
                let frame = body.into_frame(&command, metadata, 1 << 20).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(frame, expected, "headroom {headroom}, name {} bytes", metadata.producer_name.len());
            }
            match EntryBody::copy_of(&payload, ENTRY_HEADROOM_BYTES).into_frame(&command, metadata, 2000) {
                Err(ClientError::MessageTooLarge { size, max_frame_bytes: 2000 }) => {
                    // The message's size: metadata and payload (as before).
                    assert_eq!(size, magnetar_wire::encode_message(metadata, &payload).len());
                }
                other => panic!("expected MessageTooLarge, got {other:?}"),
            }
        }
    }
}
