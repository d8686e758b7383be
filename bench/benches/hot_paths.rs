//! criterion micro-benchmarks of the hot paths a produced message crosses:
//! message blob encode/decode, frame encode/decode (with the frame CRC),
//! the CRC itself, the record header + CRC + copy an append does into the
//! log's write buffer, and index page encode/decode/lookup.
//!
//! Run: `cargo bench -p magnetar-bench --bench hot_paths` (add
//! `-- --quick` for a fast pass). Dispatch selection lives inside
//! magnetar-core's shard-local types and is not reachable from here yet.

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use magnetar_storage::format::{decode_index_page, encode_index_page, IndexEntry, RecordHeader};
use magnetar_storage::IndexExtras;
use magnetar_wire::{
    decode_message, encode_frame, encode_message, peek_message, Command, FrameDecoder, MessageId, MessageMetadata,
};
use std::hint::black_box;

fn metadata(seq: u64) -> MessageMetadata {
    MessageMetadata {
        producer_name: "bench-producer-1".into(),
        sequence_id: seq,
        publish_time_ms: 1_700_000_000_000,
        num_messages: 1,
        uncompressed_size: 1024,
        ..MessageMetadata::default()
    }
}

fn wire(c: &mut Criterion) {
    let payload = vec![7u8; 1024];
    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode_message_1k", |b| b.iter(|| black_box(encode_message(&metadata(1), &payload))));
    let blob = encode_message(&metadata(1), &payload);
    g.bench_function("decode_message_1k", |b| b.iter(|| black_box(decode_message(&blob))));
    g.bench_function("peek_message_1k", |b| b.iter(|| black_box(peek_message(&blob).map(|p| p.payload.len()))));
    let send = Command::Send { producer_id: 1, sequence_id: 42, num_messages: 1 };
    let mut dst = BytesMut::with_capacity(4096);
    g.bench_function("encode_send_frame_1k", |b| {
        b.iter(|| {
            dst.clear();
            encode_frame(black_box(&send), &blob, &mut dst).ok();
            black_box(dst.len())
        })
    });
    let receipt =
        Command::SendReceipt { producer_id: 1, sequence_id: 42, message_id: MessageId::new(1024, 42, -1, -1) };
    g.bench_function("encode_receipt_frame", |b| {
        b.iter(|| {
            dst.clear();
            encode_frame(black_box(&receipt), &[], &mut dst).ok();
            black_box(dst.len())
        })
    });
    let mut one = BytesMut::new();
    encode_frame(&send, &blob, &mut one).ok();
    let one = one.freeze();
    g.bench_function("decode_send_frame_1k", |b| {
        let mut decoder = FrameDecoder::new(8 << 20);
        b.iter_batched(
            || BytesMut::from(&one[..]),
            |mut buf| black_box(decoder.decode(&mut buf).ok().flatten().map(|f| f.payload.len())),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn crc(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc32");
    for size in [64usize, 1024, 65536] {
        let data = vec![0xA5u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(format!("{size}"), |b| b.iter(|| black_box(crc32fast::hash(black_box(&data)))));
    }
    g.finish();
}

/// What `EntryLog::append` does per entry on the CPU, outside the async
/// machinery: a 48-byte record header with its CRC over header and body,
/// and the copy of the body into the write buffer.
fn append(c: &mut Criterion) {
    let body = Bytes::from(encode_message(&metadata(1), &vec![3u8; 1024]).to_vec());
    let mut g = c.benchmark_group("log");
    g.throughput(Throughput::Elements(1));
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0usize;
    let mut entry = 0u64;
    g.bench_function("append_record_1k", |b| {
        b.iter(|| {
            let need = 48 + body.len();
            if pos + need > buf.len() {
                pos = 0;
            }
            let extras = IndexExtras { publish_time_ms: 1_700_000_000_000, key_hash: 0, tag_hash: 0 };
            RecordHeader::encode(&mut buf[pos..pos + 48], 1, 1024, entry, extras, &[&body]);
            buf[pos + 48..pos + need].copy_from_slice(&body);
            pos += need;
            entry += 1;
            black_box(pos)
        })
    });
    let entries: Vec<IndexEntry> = (0..127u64)
        .map(|i| IndexEntry {
            position: i * 1100,
            body_len: 1070,
            record_crc: i as u32,
            extras: IndexExtras::default(),
        })
        .collect();
    g.bench_function("encode_index_page", |b| b.iter(|| black_box(encode_index_page(1024, 0, &entries))));
    let page = encode_index_page(1024, 0, &entries);
    g.bench_function("decode_index_page", |b| b.iter(|| black_box(decode_index_page(&page, 1024).ok())));
    let decoded = decode_index_page(&page, 1024).ok().map(|d| d.1).unwrap_or_default();
    g.bench_function("index_lookup_in_page", |b| {
        let mut e = 0u64;
        b.iter(|| {
            e = (e + 37) % 127;
            black_box(decoded.get(e as usize).map(|x| x.position))
        })
    });
    g.finish();
}

criterion_group!(benches, wire, crc, append);
criterion_main!(benches);
