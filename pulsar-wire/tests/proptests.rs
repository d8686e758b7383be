//! Property tests of the Pulsar codec: encoded frames decode to what was
//! encoded however the bytes are split, and no input makes the decoder or
//! the metadata reader panic. proptest prints the failing seed and case.

use bytes::BytesMut;
use magnetar_pulsar_wire::proto::{base_command::Type, BaseCommand, CommandSend, MessageMetadata};
use magnetar_pulsar_wire::{encode_payload_command, metadata, peek_metadata, FrameDecoder};
use proptest::prelude::*;
use prost::Message;

fn send(producer_id: u64, sequence_id: u64, n: i32) -> BaseCommand {
    BaseCommand {
        r#type: Type::Send as i32,
        send: Some(CommandSend { producer_id, sequence_id, num_messages: Some(n), ..Default::default() }),
        ..Default::default()
    }
}

proptest! {
    /// Goal: a payload frame round-trips (command, metadata, payload) when
    /// it arrives in arbitrary pieces behind another frame.
    #[test]
    fn payload_frames_round_trip(
        producer_id in any::<u64>(), sequence_id in any::<u64>(), n in 1i32..1000,
        name in "[a-z0-9-]{0,20}", key in proptest::option::of("[ -~]{0,30}"),
        payload in proptest::collection::vec(any::<u8>(), 0..2000),
        cut in proptest::collection::vec(1usize..300, 1..20),
    ) {
        let meta = MessageMetadata {
            producer_name: name.clone(), sequence_id, publish_time: 5, partition_key: key.clone(),
            num_messages_in_batch: Some(n), ..Default::default()
        }.encode_to_vec();
        let mut wire = BytesMut::new();
        encode_payload_command(&send(1, 2, 1), b"", b"x", &mut wire).unwrap();
        encode_payload_command(&send(producer_id, sequence_id, n), &meta, &payload, &mut wire).unwrap();
        let mut decoder = FrameDecoder::new(1 << 20);
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        let mut rest = &wire[..];
        let mut cuts = cut.iter().cycle();
        while !rest.is_empty() {
            let k = (*cuts.next().unwrap()).min(rest.len());
            buf.extend_from_slice(&rest[..k]);
            rest = &rest[k..];
            while let Some(f) = decoder.decode(&mut buf).unwrap() {
                frames.push(f);
            }
        }
        prop_assert_eq!(frames.len(), 2);
        let f = &frames[1];
        prop_assert_eq!(&f.command, &send(producer_id, sequence_id, n));
        let p = f.payload.as_ref().unwrap();
        prop_assert_eq!(p.metadata(), &meta[..]);
        prop_assert_eq!(&p.payload()[..], &payload[..]);
        let m = peek_metadata(p.metadata()).unwrap();
        prop_assert_eq!((m.producer_name, m.sequence_id, m.partition_key), (name.as_str(), sequence_id, key.as_deref()));
        let stored = p.stored_blob();
        prop_assert_eq!(&stored, &metadata::stored_blob(&p.checksummed()));
        let (_, sm, sp) = metadata::split_stored(&stored).unwrap();
        prop_assert_eq!((sm, sp), (&meta[..], &payload[..]));
    }

    /// Goal: arbitrary bytes, and valid frames with bytes flipped, give
    /// frames or errors, never a panic.
    #[test]
    fn never_panics(garbage in proptest::collection::vec(any::<u8>(), 0..400), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8)) {
        let mut buf = BytesMut::from(&garbage[..]);
        let mut d = FrameDecoder::new(1 << 16);
        while let Ok(Some(_)) = d.decode(&mut buf) {}
        let _ = peek_metadata(&garbage);
        let _ = metadata::split_stored(&garbage);
        let _ = metadata::batch_records(&garbage, 1000);
        let _ = metadata::metadata_properties(&garbage);

        let meta = MessageMetadata { producer_name: "p".into(), sequence_id: 1, publish_time: 2, ..Default::default() }.encode_to_vec();
        let mut wire = BytesMut::new();
        encode_payload_command(&send(1, 2, 1), &meta, &garbage, &mut wire).unwrap();
        for (at, x) in flips {
            let i = at % wire.len();
            wire[i] ^= x;
        }
        let mut d = FrameDecoder::new(1 << 16);
        while let Ok(Some(_)) = d.decode(&mut wire) {}
    }
}
