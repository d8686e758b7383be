#![allow(clippy::unwrap_used)] // tests may unwrap
//! Goal: `magnetar inspect` lists topics, cursors and ledgers of a data
//! directory, dumps entries as decoded messages, and `--verify` exits 1
//! naming the damaged file and offset. Method: a shard written through the
//! storage crate on a simulated disk with broker-style metadata, exported to
//! real files; the binary is run on it before and after flipping a byte.

use bytes::Bytes;
use magnetar_core::cursor::CursorRecord;
use magnetar_storage::sim::SimDisk;
use magnetar_storage::{EntryLog, LogConfig};
use magnetar_wire::{encode_message, MessageMetadata};
use std::process::Command;

fn write_shard(root: &std::path::Path) {
    let root = root.to_path_buf();
    glommio::LocalExecutorBuilder::default().make().unwrap().run(async move {
        let disk = SimDisk::new();
        let mut cfg = LogConfig::new("/shard-0");
        cfg.segment_bytes = 64 << 10;
        cfg.flush_bytes_max = 16 << 10;
        cfg.allow_tmpfs = true;
        let (log, _) = EntryLog::open_with(disk.clone(), cfg).await.unwrap();
        let mut topic = vec![1u8];
        topic.extend_from_slice(&1024u64.to_le_bytes());
        log.put_meta(b"t/persistent://public/default/orders", Bytes::from(topic)).unwrap();
        let cursor = CursorRecord { mark_delete_ledger: 1024, mark_delete_entry: 1, acked: vec![(1024, vec![(4, 4)])] };
        log.put_meta(b"c/persistent://public/default/orders\ns1", Bytes::from(cursor.encode())).unwrap();
        let mut last = 0;
        for seq in 0..40u64 {
            let meta = MessageMetadata {
                producer_name: "p".into(),
                sequence_id: seq,
                publish_time_ms: 1000 + seq,
                partition_key: Some(format!("k{seq}")),
                num_messages: 1,
                ..Default::default()
            };
            last = log.append(1024, encode_message(&meta, format!("payload {seq}").as_bytes())).unwrap().lsn;
            if seq == 20 {
                log.wait_durable(last).await.unwrap();
                log.checkpoint().await.unwrap();
            }
        }
        log.wait_durable(last).await.unwrap();
        log.close().await.unwrap();
        disk.export(&root).unwrap();
    });
}

fn inspect(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_magnetar")).arg("inspect").args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn inspect_lists_dumps_and_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    write_shard(tmp.path());
    let dir = tmp.path().to_str().unwrap();

    let (code, out, err) = inspect(&[dir, "--verify", "--output", "json", "--dump", "1024:38"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let shard = &v["shards"][0];
    assert_eq!(shard["clean_shutdown"], true);
    assert_eq!(shard["ledgers"][0]["ledger"], 1024);
    assert_eq!(shard["ledgers"][0]["entries"], 40);
    let meta = shard["metadata"].as_array().unwrap();
    assert!(meta.iter().any(|m| m["kind"] == "topic" && m["ledger"] == 1024), "{meta:?}");
    let c = meta.iter().find(|m| m["kind"] == "cursor").unwrap();
    assert_eq!((c["subscription"].as_str(), c["mark_delete"].as_str()), (Some("s1"), Some("1024:1")));
    assert_eq!(c["acked"], serde_json::json!([{"ledger": 1024, "ranges": [[4, 4]]}]));
    assert!(shard["checked"]["records"].as_u64().unwrap() >= 42);
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["id"], "1024:38");
    assert_eq!(entries[0]["payload_utf8"], "payload 38");
    assert_eq!(entries[0]["partition_key"], "k38");
    assert_eq!(entries[0]["index_publish_time_ms"], 0); // appended without extras here
    assert_eq!(entries[1]["sequence_id"], 39);

    let (code, out, _) = inspect(&[dir]);
    assert_eq!(code, 0);
    assert!(out.contains("topic persistent://public/default/orders  ledger 1024"), "{out}");

    // Flip one byte in the first batch: a full verify fails, naming the
    // segment and the batch's offset.
    let seg = tmp.path().join("shard-0/log/00000000000000000000.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[200] ^= 0x40;
    std::fs::write(&seg, &bytes).unwrap();
    let (code, _, err) = inspect(&[dir, "--verify"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("00000000000000000000.seg") && err.contains("at offset 0"), "{err}");
    // A dump of an unknown ledger is an error too.
    let (code, _, err) = inspect(&[dir, "--dump", "7"]);
    assert_eq!(code, 1);
    assert!(err.contains("ledger 7 not found"), "{err}");
}
