#![allow(clippy::unwrap_used)]
//! Goal: at the refusal watermark produce is refused with the retriable
//! `StorageFull` while consumers keep reading, and produce resumes by itself
//! once usage drops. Method: one shard whose disk usage comes from an
//! injected function reading a percentage the test sets; produce, raise the
//! usage past 90 %, produce (refused) and consume (works), lower it, produce.

mod common;

use bytes::Bytes;
use glommio::channels::local_channel;
use magnetar_core::disk_watch::DiskWatermarks;
use magnetar_core::{Broker, BrokerConfig, ConsumerEvent};
use magnetar_wire::{encode_message, ErrorCode, MessageMetadata};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn blob(seq: u64) -> Bytes {
    let meta = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: seq,
        publish_time_ms: 1000 + seq,
        partition_key: Some(format!("k{seq}")),
        num_messages: 1,
        ..Default::default()
    };
    encode_message(&meta, format!("m{seq}").as_bytes())
}

#[test]
fn produce_refused_at_the_watermark_while_consumers_read() {
    let dir = tempfile::tempdir().unwrap();
    let used_pct = Arc::new(AtomicU64::new(50));
    let mut c = BrokerConfig::new(dir.path(), 1);
    c.pin_cpus = false;
    c.segment_bytes = 4 << 20;
    c.write_cache_bytes = 1 << 20;
    let u = used_pct.clone();
    c.disk_watermarks = DiskWatermarks {
        check_interval: Duration::from_millis(10),
        usage: Some(Arc::new(move |_| Ok((u.load(Ordering::SeqCst), 100)))),
        ..DiskWatermarks::default()
    };
    common::run_on_shard0(c, move |broker: Broker| {
        let used_pct = used_pct.clone();
        async move {
            let topic = "persistent://public/default/wm";
            let p = broker.create_producer(topic, "p").await.unwrap();
            for seq in 0..3 {
                broker.send(&p, 1, blob(seq)).await.unwrap();
            }
            used_pct.store(92, Ordering::SeqCst);
            glommio::timer::sleep(Duration::from_millis(100)).await;
            let e = broker.send(&p, 1, blob(3)).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::StorageFull, "{e}");
            assert!(e.code.is_retriable());
            // Consumers keep reading.
            let (tx, rx) = local_channel::new_unbounded();
            let sink = broker.register_sink(tx);
            let req = common::exclusive_from_earliest(topic);
            let consumer = broker.subscribe(req, sink).await.unwrap();
            broker.flow(&consumer, 10);
            let mut seq = 0u64;
            while seq < 3 {
                let ev = glommio::timer::timeout(Duration::from_secs(10), async { Ok(rx.recv().await) })
                    .await
                    .unwrap()
                    .unwrap();
                assert!(matches!(ev, ConsumerEvent::Message { .. } | ConsumerEvent::Run { .. }), "{ev:?}");
                for (message_id, _, _) in ev.deliveries() {
                    assert_eq!(message_id.entry, seq);
                    seq += 1;
                }
            }
            // Space freed: produce resumes without a restart.
            used_pct.store(80, Ordering::SeqCst);
            glommio::timer::sleep(Duration::from_millis(100)).await;
            let id = broker.send(&p, 1, blob(3)).await.unwrap();
            assert_eq!(id.entry, 3);
        }
    });

    // The core passed publish time and key hash to the index.
    let img = magnetar_storage::inspect::ShardImage::load(
        &dir.path().join("shard-0"),
        magnetar_storage::inspect::ScanMode::Verify,
        &mut |_, _| {},
    )
    .unwrap();
    let (_, l) = img.ledgers.iter().next().unwrap();
    assert_eq!(l.index.len(), 4);
    for (seq, e) in l.index.iter().enumerate() {
        assert_eq!(e.extras.publish_time_ms, 1000 + seq as u64);
        assert_eq!(e.extras.key_hash, magnetar_storage::key_hash(format!("k{seq}").as_bytes()));
    }
}

fn dir_bytes(p: &std::path::Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
        let Ok(md) = e.metadata() else { continue };
        total += if md.is_dir() { dir_bytes(&e.path()) } else { md.len() };
    }
    total
}

/// Goal: a refusal at the watermark clears by itself once retention frees
/// space. Method: the disk's "usage" is the data directory's size over a
/// fake 48 MiB disk; a subscription that acknowledges nothing pins every
/// ledger (16-entry ledgers of 64 KiB entries, 4 MiB segments) until
/// produce is refused; then it acknowledges everything, and retention
/// (every 100 ms, default policies: keep nothing acknowledged) deletes the
/// closed ledgers, a checkpoint removes their segments, and produce resumes
/// without a restart.
#[test]
fn retention_frees_space_and_produce_resumes_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = BrokerConfig::new(dir.path(), 1);
    c.pin_cpus = false;
    c.segment_bytes = 4 << 20;
    c.write_cache_bytes = 1 << 20;
    c.ledger_rollover = magnetar_core::ledgers::Rollover {
        max_entries: 16,
        min_age_ms: 0,
        ..magnetar_core::ledgers::Rollover::default()
    };
    c.retention_check_interval = Duration::from_millis(100);
    let data = dir.path().to_path_buf();
    c.disk_watermarks = DiskWatermarks {
        check_interval: Duration::from_millis(50),
        usage: Some(Arc::new(move |_| Ok((dir_bytes(&data), 48 << 20)))),
        ..DiskWatermarks::default()
    };
    common::run_on_shard0(c, move |broker: Broker| async move {
        let topic = "persistent://public/default/fill";
        let (tx, _rx) = local_channel::new_unbounded();
        let sink = broker.register_sink(tx);
        let consumer = broker.subscribe(common::exclusive_from_earliest(topic), sink).await.unwrap();
        let p = broker.create_producer(topic, "p").await.unwrap();
        let body = Bytes::from(vec![7u8; 64 << 10]);
        let fill = |seq: u64| {
            let meta =
                MessageMetadata { producer_name: "p".into(), sequence_id: seq, num_messages: 1, ..Default::default() };
            encode_message(&meta, &body)
        };
        let mut last = None;
        let mut refused = false;
        for seq in 0..2000u64 {
            match broker.send(&p, 1, fill(seq)).await {
                Ok(id) => last = Some(id),
                Err(e) if e.code == ErrorCode::StorageFull => {
                    refused = true;
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(refused, "the disk never filled");
        let last = last.unwrap();
        assert!(last.ledger > 1024 * 10, "many ledgers rolled: {last}");
        broker.ack(&consumer, magnetar_wire::AckType::Cumulative, vec![last], true).await.unwrap();
        let mut resumed = false;
        for _ in 0..200 {
            glommio::timer::sleep(Duration::from_millis(50)).await;
            if broker.send(&p, 1, fill(9999)).await.is_ok() {
                resumed = true;
                break;
            }
        }
        assert!(resumed, "produce did not resume within 10 s");
    });
}

#[test]
fn statvfs_reports_the_data_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (used, total) = magnetar_core::disk_watch::statvfs_usage(dir.path()).unwrap();
    assert!(total > 0 && used <= total, "{used} of {total}");
    let pct = DiskWatermarks::default().measure(dir.path()).unwrap();
    assert!(pct <= 100);
    // Same as df's Use% (rounded down here, up there): within 1 %.
    if let Ok(out) = std::process::Command::new("df").arg("--output=pcent").arg(dir.path()).output() {
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(df) = text.lines().nth(1).and_then(|l| l.trim().trim_end_matches('%').parse::<i32>().ok()) {
            assert!((df - i32::from(pct)).abs() <= 1, "df says {df} %, statvfs_usage {pct} %");
        }
    }
}
