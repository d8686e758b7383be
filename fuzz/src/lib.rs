//! Bodies of the fuzz targets: each takes arbitrary bytes, feeds them to
//! decoders that read bytes from the network or the disk, and must return
//! without panicking whatever the bytes (a decoder answers garbage with an
//! error). Checksums would stop a fuzzer at the first check, so each body
//! also tries the bytes with their checksum (and magic) made right, to reach
//! the field checks behind them.
//!
//! The libFuzzer binaries in `fuzz_targets/` call these (`scripts/fuzz.sh
//! <target> <minutes>`, on stable); `tests/smoke.rs` replays the committed
//! seeds and runs them over seeded random and mutated inputs, so CI
//! exercises them.

use bytes::{Bytes, BytesMut};
use magnetar_storage::format::{self as sf, BatchHeader, Checkpoint, CleanMarker, RecordHeader};
use magnetar_storage::keyindex;
use magnetar_storage::PAGE_BYTES;

const PAGE: usize = PAGE_BYTES as usize;

/// Wire frames and commands (`magnetar_wire::frame`): the bytes as a stream
/// of frames; as one command; and as the body of a frame with a correct
/// length and checksum (so the command decoder behind them runs).
pub fn wire_frame(data: &[u8]) {
    let mut decoder = magnetar_wire::FrameDecoder::new(magnetar_wire::FRAME_BYTES_MAX_DEFAULT);
    let mut src = BytesMut::from(data);
    // Frames are consumed from `src`; stop at the first error or when no
    // whole frame is left. A run that decodes splits into exactly its
    // lengths, covering the payload.
    while let Ok(Some(frame)) = decoder.decode(&mut src) {
        check_payload_crc(&frame);
        if let magnetar_wire::Command::MessageRun { message_id, lengths, .. } = &frame.command {
            let entries = magnetar_wire::run_entries(*message_id, lengths, &frame.payload);
            let entries = entries.unwrap_or_else(|e| panic!("a decoded run does not split: {e}"));
            let total: usize = entries.map(|(_, blob)| blob.len()).sum();
            assert_eq!(total, frame.payload.len(), "a decoded run's entries do not cover its payload");
        }
    }

    let _ = magnetar_wire::decode_command(data);

    let mut framed = BytesMut::with_capacity(data.len() + 8);
    let len = u32::try_from(data.len() + 4).unwrap_or(u32::MAX);
    framed.extend_from_slice(&len.to_le_bytes());
    framed.extend_from_slice(&crc32fast::hash(data).to_le_bytes());
    framed.extend_from_slice(data);
    let mut decoder = magnetar_wire::FrameDecoder::new(magnetar_wire::FRAME_BYTES_MAX_DEFAULT);
    if let Ok(Some(frame)) = decoder.decode(&mut framed) {
        check_payload_crc(&frame);
    }
}

/// A decoded frame's own CRC-32 of its payload (what the broker's log keeps
/// as the entry's checksum) is that of exactly its payload, for large
/// payloads only.
fn check_payload_crc(frame: &magnetar_wire::Frame) {
    let want = (frame.payload.len() >= magnetar_wire::PAYLOAD_CRC_MIN).then(|| crc32fast::hash(&frame.payload));
    assert_eq!(frame.payload_crc, want, "a decoded frame's payload_crc is not its payload's");
}

/// Message blobs (`magnetar_wire::message`) and batch payloads
/// (`magnetar_wire::batch`): what a producer sends and a consumer unpacks.
pub fn wire_message(data: &[u8]) {
    let _ = magnetar_wire::peek_message(data);
    let blob = Bytes::copy_from_slice(data);
    let decoded = magnetar_wire::decode_message(&blob);
    // The consumer's allocation-free reader accepts exactly what the
    // verifying decoder accepts, and reads the same (a panic here is a
    // divergence, not bad input).
    let viewed = magnetar_wire::view_message(&blob).map(|v| (v.to_metadata(&blob), blob.slice(v.payload_offset..)));
    assert_eq!(viewed, decoded, "view_message and decode_message disagree");
    if let Ok((meta, payload)) = decoded {
        let _ = magnetar_wire::decode_batch(&payload, meta.num_messages);
    }
    // The bytes as a batch payload, for a count taken from their first byte.
    if let Some((&n, rest)) = data.split_first() {
        let _ = magnetar_wire::decode_batch(&Bytes::copy_from_slice(rest), u32::from(n));
    }
}

/// Storage pages and records (`magnetar_storage::format`): batch headers and
/// the records behind them, index pages, checkpoints and clean markers, as
/// read back from a damaged disk; and key index file headers and pages.
pub fn storage_records(data: &[u8]) {
    // Decoders that take a fixed-size header get at least that many bytes
    // (their callers read whole pages).
    let mut page = data.to_vec();
    if page.len() < PAGE {
        page.resize(PAGE, 0);
    }

    let _ = Checkpoint::decode(data);
    let _ = CleanMarker::decode(data);
    let _ = sf::split_meta(data);
    if data.len() >= sf::RECORD_HEADER_BYTES {
        let _ = RecordHeader::decode(data);
    }

    // Index page as read, then with magic and checksum made right.
    let _ = sf::decode_index_page(&page, 1);
    let mut idx = page.clone();
    idx[0..4].copy_from_slice(&sf::INDEX_MAGIC);
    let c = sf::crc(&[&idx[8..PAGE]]);
    idx[4..8].copy_from_slice(&c.to_le_bytes());
    let _ = sf::decode_index_page(&idx, 1);

    // Key index files (`magnetar_storage::keyindex`): the header region as
    // read and with magic and checksum made right; an item page likewise.
    let _ = keyindex::decode_key_file_header(data);
    if data.len() >= keyindex::KEY_FILE_HEADER_BYTES {
        let mut h = data.to_vec();
        h[0..8].copy_from_slice(&keyindex::KEY_FILE_MAGIC);
        let len = (h.len() as u64).to_le_bytes();
        h[16..24].copy_from_slice(&len);
        let c = sf::crc(&[&h[12..]]);
        h[8..12].copy_from_slice(&c.to_le_bytes());
        if let Ok(hdr) = keyindex::decode_key_file_header(&h) {
            let _ = keyindex::key_pages_for(&hdr.fence, data.len() as u32);
        }
    }
    let _ = keyindex::decode_key_page(&page, 0);
    let mut kp = page.clone();
    kp[0..4].copy_from_slice(&keyindex::KEY_PAGE_MAGIC);
    kp[12..16].copy_from_slice(&0u32.to_le_bytes());
    let c = sf::crc(&[&kp[8..PAGE]]);
    kp[4..8].copy_from_slice(&c.to_le_bytes());
    let _ = keyindex::decode_key_page(&kp, 0);

    // Batch header as read, then with magic and header checksum made right,
    // then its records walked (with the body checksum made right too).
    let _ = BatchHeader::decode(&page);
    let mut batch = page;
    batch[0..8].copy_from_slice(&sf::BATCH_MAGIC);
    let c = sf::crc(&[&batch[12..sf::BATCH_HEADER_BYTES]]);
    batch[8..12].copy_from_slice(&c.to_le_bytes());
    if let Ok(h) = BatchHeader::decode(&batch) {
        let _ = h.verify_body(&batch);
        let _ = sf::could_be_torn(&h, &batch);
        for r in sf::records(&h, &batch) {
            if r.is_err() {
                break;
            }
        }
    }
    // The data as records after a valid header that claims them all.
    let records_len = u32::try_from(data.len()).unwrap_or(u32::MAX);
    let batch_len = sf::pad_to_page(sf::BATCH_HEADER_BYTES as u64 + u64::from(records_len));
    if let Ok(batch_len) = u32::try_from(batch_len) {
        let mut b = vec![0u8; batch_len as usize];
        b[sf::BATCH_HEADER_BYTES..sf::BATCH_HEADER_BYTES + data.len()].copy_from_slice(data);
        let record_count = data.first().map_or(0, |n| u32::from(*n % 8));
        let body_crc = sf::crc(&[&b[sf::BATCH_HEADER_BYTES..]]);
        let h = BatchHeader {
            batch_len,
            record_count,
            seq: 0,
            position: 0,
            records_len,
            body_crc,
            flags: 0,
            segment_len: 0,
        };
        h.encode(&mut b);
        if let Ok(h) = BatchHeader::decode(&b) {
            for r in sf::records(&h, &b) {
                if r.is_err() {
                    break;
                }
            }
        }
    }
}

/// The broker's cursor record (`c/…`, `magnetar_core::cursor`). A record
/// that decodes encodes to the same bytes.
pub fn core_cursor(data: &[u8]) {
    if let Ok(rec) = magnetar_core::cursor::CursorRecord::decode(data) {
        let again = magnetar_core::cursor::CursorRecord::decode(&rec.encode());
        assert_eq!(again.as_ref(), Ok(&rec), "a decoded c/ record re-encodes to another");
    }
}

/// The broker's subscription state record (`s/…`,
/// `magnetar_core::sub_state`).
pub fn core_records(data: &[u8]) {
    if let Ok(state) = magnetar_core::sub_state::SubState::decode(data) {
        // What decodes encodes to what decodes.
        let again = magnetar_core::sub_state::SubState::decode(&state.encode());
        assert!(again.is_ok(), "a decoded s/ record re-encodes to one that does not decode: {again:?}");
    }
}

/// Pulsar's binary protocol (`magnetar_pulsar_wire`), what a Pulsar client
/// sends the Pulsar door: the bytes as a stream of frames (each command a
/// protobuf, a payload command's checksum and metadata behind it); as the
/// body of one frame with a correct length; and as message metadata and a
/// stored message blob.
pub fn pulsar_frame(data: &[u8]) {
    // The door's limit: 5 MiB of message plus the frame's padding.
    let max = (5u32 << 20).saturating_add(magnetar_pulsar_wire::FRAME_PADDING_BYTES);
    let mut decoder = magnetar_pulsar_wire::FrameDecoder::new(max);
    let mut src = BytesMut::from(data);
    while let Ok(Some(_frame)) = decoder.decode(&mut src) {}

    let mut framed = BytesMut::with_capacity(data.len() + 4);
    framed.extend_from_slice(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    framed.extend_from_slice(data);
    let _ = magnetar_pulsar_wire::FrameDecoder::new(max).decode(&mut framed);

    let _ = magnetar_pulsar_wire::peek_metadata(data);
    let _ = magnetar_pulsar_wire::metadata::split_stored(data);
}
