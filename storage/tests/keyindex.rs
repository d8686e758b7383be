//! Per-shard key index.
//!
//! Goal: `find_key` returns the newest entries with a key hash first, honours
//! `before` and the ledger filter, gives the same answer from memory, from
//! key index files, after a crash (files plus the log tail rebuilt into
//! memory) and after a key index file is damaged (rebuilt from the ledger
//! indexes); files age out with their ledgers.
//!
//! Method: a model of (ledger, entry, key, time) on a `SimDisk`, with a tiny
//! `key_index_items_per_file` so that many files are written; the same
//! queries compared with the model at each stage.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use bytes::Bytes;
use common::{run, small_config};
use magnetar_storage::inspect::{ScanMode, ShardImage};
use magnetar_storage::sim::{SimDisk, SimRng};
use magnetar_storage::{key_hash, EntryLog, IndexExtras, KeyHit, LogConfig, NewEntry, StorageError};

fn cfg() -> LogConfig {
    let mut c = small_config("/shard-0");
    c.key_index_items_per_file = 40;
    c
}

#[derive(Clone)]
struct Item {
    ledger: u64,
    entry: u64,
    key: Option<String>,
    time: u64,
}

fn expected(model: &[Item], key: &str, ledgers: &[u64], before: Option<u64>, max: usize) -> Vec<KeyHit> {
    let mut v: Vec<KeyHit> = model
        .iter()
        .filter(|i| i.key.as_deref() == Some(key) && ledgers.contains(&i.ledger) && before.is_none_or(|b| i.time < b))
        .map(|i| KeyHit { publish_time_ms: i.time, ledger: i.ledger, entry: i.entry })
        .collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v.truncate(max);
    v
}

async fn check(log: &EntryLog<SimDisk>, model: &[Item], ctx: &str) {
    for k in 0..12 {
        let key = format!("key-{k}");
        for ledgers in [&[1u64, 2, 3][..], &[2][..]] {
            for before in [None, Some(1_000 + 150), Some(1_000 + 400)] {
                for max in [3usize, 1000] {
                    let ok = |l: u64| ledgers.contains(&l);
                    let got = log.find_key(key_hash(key.as_bytes()), &ok, before, max).await.unwrap();
                    // Hashes may collide in general; these keys do not.
                    assert_eq!(
                        got,
                        expected(model, &key, ledgers, before, max),
                        "{ctx}: {key} {ledgers:?} {before:?} {max}"
                    );
                }
            }
        }
    }
}

#[test]
fn find_newest_first_from_memory_files_and_after_crash() {
    run(60, || async {
        let seed = common::seed_from_env().unwrap_or_else(common::fresh_seed);
        println!("keyindex: seed {seed} (replay: MAGNETAR_SEED={seed})");
        let mut rng = SimRng::new(seed);
        let disk = SimDisk::new();
        let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
        let mut model = Vec::new();
        let mut last = 0;
        for i in 0..600u64 {
            let ledger = 1 + rng.below(3);
            let key = (!rng.chance(1, 5)).then(|| format!("key-{}", rng.below(12)));
            let time = 1_000 + i;
            let extras = IndexExtras {
                publish_time_ms: time,
                key_hash: key.as_ref().map_or(0, |k| key_hash(k.as_bytes())),
                tag_hash: 0,
            };
            let a = log.append(ledger, NewEntry::new(Bytes::from(format!("{i}"))).extras(extras)).unwrap();
            last = a.lsn;
            model.push(Item { ledger, entry: a.entry, key, time });
        }
        log.wait_durable(last).await.unwrap();
        check(&log, &model, "in memory").await;

        log.maintain_key_index(false).await.unwrap();
        let (files, in_memory) = log.key_index_files();
        assert!(files.len() >= 10, "{} files, {in_memory} items in memory", files.len());
        assert!(in_memory < 40);
        check(&log, &model, "from files").await;

        // The inspector reads the files and checks every item page.
        let image = disk.fork();
        {
            let tmp = tempfile::tempdir().unwrap();
            image.export(tmp.path()).unwrap();
            let shard = tmp.path().join("shard-0");
            let img = ShardImage::load(&shard, ScanMode::Verify, &mut |_, _| {}).unwrap();
            assert_eq!(img.key_files.len(), files.len());
            assert!(img.checked.key_pages >= files.len() as u64);
            let victim = &img.key_files[0].path;
            let mut b = std::fs::read(victim).unwrap();
            let off = (img.key_files[0].header.header_pages * 4096) as usize + 40;
            b[off] ^= 1;
            std::fs::write(victim, b).unwrap();
            match ShardImage::load(&shard, ScanMode::Verify, &mut |_, _| {}) {
                Err(StorageError::Corrupt { file, .. }) => assert_eq!(&file, victim),
                other => panic!("damaged key page not reported: {other:?}"),
            }
        }

        // A crash: the files plus what the log recovered past them.
        drop(log);
        let (log, _) = EntryLog::open_with(image.clone(), cfg()).await.unwrap();
        check(&log, &model, "after crash").await;
        assert_eq!(log.key_index_files().0.len(), files.len());

        // A damaged file: it and every later one are removed at open and
        // their entries indexed again from the ledger indexes.
        drop(log);
        let (_, _, victim) = &files[files.len() / 2];
        image.damage(victim, 30, b"garbage!");
        let (log, _) = EntryLog::open_with(image.clone(), cfg()).await.unwrap();
        assert_eq!(log.key_index_files().0.len(), files.len() / 2);
        check(&log, &model, "after a damaged file").await;
        log.maintain_key_index(true).await.unwrap();
        check(&log, &model, "rewritten").await;

        // Files age out with the ledgers they point to.
        for ledger in [1, 2, 3] {
            let lsn = log.delete_ledger(ledger).unwrap();
            log.wait_durable(lsn).await.unwrap();
        }
        log.checkpoint().await.unwrap();
        log.maintain_key_index(false).await.unwrap();
        assert_eq!(log.key_index_files(), (vec![], 0));
        let none = log.find_key(key_hash(b"key-1"), &|_| true, None, 10).await.unwrap();
        assert!(none.is_empty(), "{none:?}");
    });
}

#[test]
fn upkeep_visits_only_ledgers_appended_to() {
    run(60, || async {
        let disk = SimDisk::new();
        let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
        let put = |ledger: u64, key: &str| {
            let extras =
                IndexExtras { publish_time_ms: 1_000 + ledger, key_hash: key_hash(key.as_bytes()), tag_hash: 0 };
            log.append(ledger, NewEntry::new(Bytes::from_static(b"x")).extras(extras)).unwrap().lsn
        };
        let mut last = 0;
        for ledger in 1..=200 {
            last = put(ledger, "k");
        }
        // Laid out and durable, not yet added: all behind.
        log.wait_durable(last).await.unwrap();
        assert_eq!(log.key_index_behind(), 200);
        log.maintain_key_index(false).await.unwrap();
        assert_eq!(log.key_index_behind(), 0);
        let lsn = put(77, "only");
        log.wait_durable(lsn).await.unwrap();
        assert_eq!(log.key_index_behind(), 1);
        let hits = log.find_key(key_hash(b"only"), &|_| true, None, 10).await.unwrap();
        assert_eq!(hits.iter().map(|h| (h.ledger, h.entry)).collect::<Vec<_>>(), vec![(77, 1)]);
        assert_eq!(log.key_index_behind(), 0);

        // After a restart every ledger is visited once.
        log.checkpoint().await.unwrap();
        log.close().await.unwrap();
        let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
        assert_eq!(log.key_index_behind(), 200);
        log.maintain_key_index(false).await.unwrap();
        assert_eq!(log.key_index_behind(), 0);
        assert_eq!(log.find_key(key_hash(b"k"), &|_| true, None, 1000).await.unwrap().len(), 200);
    });
}
