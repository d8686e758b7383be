//! Any byte sequence fed to the frame decoder (and any payload it yields fed
//! to the blob decoder) returns, never panics. The first byte picks the frame
//! limit so small limits get exercised too.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use magnetar_wire::{decode_message, peek_message, FrameDecoder, FRAME_BYTES_MAX_DEFAULT};

fuzz_target!(|data: &[u8]| {
    let (max, data) = match data.split_first() {
        Some((0, rest)) => (8, rest),
        Some((_, rest)) => (FRAME_BYTES_MAX_DEFAULT, rest),
        None => return,
    };
    let mut decoder = FrameDecoder::new(max);
    let mut buf = BytesMut::from(data);
    loop {
        let before = buf.len();
        match decoder.decode(&mut buf) {
            Ok(None) => break,
            Ok(Some(frame)) => {
                let _ = decode_message(&frame.payload);
                let _ = peek_message(&frame.payload);
                // A run that decoded splits into exactly its payload.
                if let magnetar_wire::Command::MessageRun { message_id, lengths, .. } = &frame.command {
                    let entries = magnetar_wire::run_entries(*message_id, lengths, &frame.payload)
                        .unwrap_or_else(|e| panic!("a decoded run does not split: {e}"));
                    let total: usize = entries.map(|(_, blob)| blob.len()).sum();
                    assert_eq!(total, frame.payload.len());
                }
            }
            Err(e) if e.is_fatal() => break,
            Err(_) => {}
        }
        assert!(buf.len() < before, "decode made no progress");
    }
    let blob = bytes::Bytes::copy_from_slice(data);
    let _ = decode_message(&blob);
});
