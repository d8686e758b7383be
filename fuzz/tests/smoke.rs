//! Goal: the fuzz targets' bodies hold on stable Rust too, so CI exercises
//! them without nightly or libFuzzer: no decoder panics on random bytes or
//! on valid encodings with bytes flipped, cut, inserted or overwritten.
//!
//! Method: per target, a few thousand inputs from a seeded `SimRng` (SplitMix64; the
//! seed is printed; `MAGNETAR_SEED=<n>` replays it, `MAGNETAR_FUZZ_ITERS=<n>`
//! runs longer), half of them mutations of real encodings (the seeds a
//! libFuzzer corpus would start from), after replaying every committed seed
//! in `fuzz/seeds/<target>/` (where a crash a fuzzer found goes, once fixed,
//! as its regression test). A panic names the target, seed and input.

use bytes::BytesMut;
use magnetar_storage::sim::SimRng;
use magnetar_wire::{AckType, Command, MessageId, MessageMetadata};
use std::panic::{catch_unwind, AssertUnwindSafe};

fn seed() -> u64 {
    std::env::var("MAGNETAR_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    })
}

fn iterations() -> u64 {
    std::env::var("MAGNETAR_FUZZ_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(20_000)
}

/// The committed seed corpus of `name` (`fuzz/seeds/<name>/`, what
/// `scripts/fuzz.sh` starts from), sorted by file name. With
/// `MAGNETAR_FUZZ_WRITE_SEEDS=1`, `built_in` is written there first (how
/// the seeds were made; existing files are kept).
fn seeds(name: &str, built_in: &[Vec<u8>]) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds").join(name);
    if std::env::var_os("MAGNETAR_FUZZ_WRITE_SEEDS").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(&dir).expect("creating the seeds dir");
        for (i, input) in built_in.iter().enumerate() {
            std::fs::write(dir.join(format!("built-in-{i:02}")), input).expect("writing a seed");
        }
    }
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| {
            let path = e.expect("a dir entry").path();
            let input = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            (path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), input)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no committed seeds in {}", dir.display());
    out
}

/// Runs `body` on every committed seed of `name` (and on every crash a
/// fuzzer found, once fixed and committed there), then over random inputs
/// and mutations of the seeds and `corpus`.
fn run(name: &str, body: fn(&[u8]), corpus: &[Vec<u8>], max_random: u64) {
    let committed = seeds(name, corpus);
    for (file, input) in &committed {
        if catch_unwind(AssertUnwindSafe(|| body(input))).is_err() {
            panic!("{name} panicked on the seed fuzz/seeds/{name}/{file}");
        }
    }
    let corpus: Vec<Vec<u8>> = corpus.iter().cloned().chain(committed.into_iter().map(|(_, input)| input)).collect();
    let corpus = &corpus[..];
    let seed = seed();
    eprintln!("{name}: MAGNETAR_SEED={seed}");
    let mut rng = SimRng::new(seed);
    for case in 0..iterations() {
        let input = if corpus.is_empty() || rng.below(2) == 0 {
            let n = rng.below(max_random) as usize;
            rng.bytes(n)
        } else {
            let pick = corpus[rng.below(corpus.len() as u64) as usize].clone();
            rng.mutate(pick)
        };
        if catch_unwind(AssertUnwindSafe(|| body(&input))).is_err() {
            panic!("{name} panicked: MAGNETAR_SEED={seed}, case {case}, input {input:?}");
        }
    }
}

fn frame(command: &Command, payload: &[u8]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    magnetar_wire::encode_frame(command, payload, &mut buf).expect("encode");
    buf.to_vec()
}

fn blob(num_messages: u32) -> Vec<u8> {
    let meta = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: 3,
        num_messages,
        partition_key: Some("k".into()),
        tag: Some("t".into()),
        properties: vec![("a".into(), "b".into())],
        ..Default::default()
    };
    let mut payload = BytesMut::new();
    if num_messages > 1 {
        for i in 0..num_messages {
            let m = magnetar_wire::BatchMessage { payload: bytes::Bytes::from(format!("m{i}")), ..Default::default() };
            magnetar_wire::encode_batch_record_into(&m, &mut payload);
        }
    } else {
        payload.extend_from_slice(b"payload");
    }
    magnetar_wire::encode_message(&meta, &payload).to_vec()
}

#[test]
fn wire_frame_never_panics() {
    let id = MessageId::new(1024, 7, -1, 2);
    let corpus = vec![
        frame(&Command::Ping, &[]),
        frame(
            &Command::Ack {
                consumer_id: 1,
                ack_type: AckType::Individual,
                message_ids: vec![id, id],
                request_id: 9,
                batch_sizes: vec![4, 0],
            },
            &[],
        ),
        frame(&Command::Message { consumer_id: 1, message_id: id, redelivery_count: 2, ack_set: vec![5] }, &blob(3)),
        frame(&Command::Send { producer_id: 1, sequence_id: 4, num_messages: 1 }, &blob(1)),
        // A payload large enough to get its own CRC-32 (`Frame::payload_crc`).
        frame(
            &Command::Send { producer_id: 1, sequence_id: 5, num_messages: 1 },
            &[blob(1), vec![7; magnetar_wire::PAYLOAD_CRC_MIN]].concat(),
        ),
        {
            let (a, b) = (blob(1), blob(3));
            let lengths = vec![a.len() as u32, 0, b.len() as u32];
            frame(
                &Command::MessageRun { consumer_id: 1, message_id: id, redelivery_count: 0, lengths },
                &[a, b].concat(),
            )
        },
    ];
    // The commands alone (what `decode_command` sees) too.
    let mut all = corpus.clone();
    all.extend(corpus.iter().filter(|f| f.len() > 12).map(|f| f[12..].to_vec()));
    run("wire_frame", magnetar_fuzz::wire_frame, &all, 512);
}

#[test]
fn wire_message_never_panics() {
    run("wire_message", magnetar_fuzz::wire_message, &[blob(1), blob(3), blob(70)], 512);
}

#[test]
fn storage_records_never_panic() {
    use magnetar_storage::format as sf;
    let entries: Vec<sf::IndexEntry> = (0..3)
        .map(|i| sf::IndexEntry {
            position: i * 4096,
            body_len: 10,
            record_crc: 1,
            extras: magnetar_storage::IndexExtras { publish_time_ms: i, key_hash: 2, tag_hash: 3 },
        })
        .collect();
    let clean = sf::CleanMarker { ckpt_seq: 1, position: 4096, next_batch_seq: 2 }.encode();
    let corpus = vec![sf::encode_index_page(1, 0, &entries), clean, vec![0u8; 64]];
    run("storage_records", magnetar_fuzz::storage_records, &corpus, 300);
}

#[test]
fn core_records_never_panic() {
    let mut state = vec![1, 2, 1, 0, b't'];
    // One partly acknowledged batch of 70 messages (two bit words), no counts.
    state.extend_from_slice(&1u32.to_le_bytes());
    state.extend_from_slice(&1024u64.to_le_bytes());
    state.extend_from_slice(&5u64.to_le_bytes());
    state.extend_from_slice(&70u32.to_le_bytes());
    state.extend_from_slice(&0b1011u64.to_le_bytes());
    state.extend_from_slice(&0u64.to_le_bytes());
    state.extend_from_slice(&0u32.to_le_bytes());
    assert!(magnetar_core::sub_state::SubState::decode(&state).is_ok());
    run("core_records", magnetar_fuzz::core_records, &[state], 300);
}

#[test]
fn core_cursor_never_panics() {
    let cursor = magnetar_core::cursor::CursorRecord {
        mark_delete_ledger: 1024,
        mark_delete_entry: 3,
        acked: vec![(1024, vec![(5, 5), (9, 12)]), (2048, vec![(0, 1)])],
    }
    .encode();
    run("core_cursor", magnetar_fuzz::core_cursor, &[cursor], 300);
}
