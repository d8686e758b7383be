//! Starting and stopping the shards: one glommio executor per shard, pinned
//! to a CPU, each opening (and recovering) its own entry log, joined by the
//! cross-shard mesh.

use super::mesh::{build_mesh, Mesh};
use super::{Shard, SHARDS_MAX};
use crate::api::Broker;
use crate::config::BrokerConfig;
use crate::error::StartError;
use glommio::{LocalExecutorBuilder, Placement};
use magnetar_storage::{DmaDisk, EntryLog, LogConfig};
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

const FORMAT_FILE: &str = "magnetar.format";
const LOCK_FILE: &str = "magnetar.lock";
const DATA_FORMAT_VERSION: u32 = 1;

/// The running shards.
pub struct Running {
    handles: Vec<glommio::ExecutorJoinHandle<Result<(), String>>>,
    shutdown: Arc<AtomicBool>,
    /// The data directory's lock, held until every shard has stopped (it is
    /// dropped, releasing the `flock`, after `join`'s last shard).
    _lock: std::fs::File,
}

impl Running {
    /// Asks every shard to shut down cleanly (same as setting the flag given
    /// to `launch`).
    pub fn shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
    }

    /// Waits for every shard to stop; the first shard error, if any.
    pub fn join(self) -> Result<(), StartError> {
        let mut first = None;
        for (i, h) in self.handles.into_iter().enumerate() {
            let r = match h.join() {
                Ok(Ok(())) => continue,
                Ok(Err(message)) => StartError::Shard { shard: i as u32, message },
                Err(e) => StartError::Shard { shard: i as u32, message: format!("executor failed: {e}") },
            };
            first.get_or_insert(r);
        }
        first.map_or(Ok(()), Err)
    }
}

/// Takes the data directory's exclusive lock: a `flock` on `magnetar.lock`,
/// which then holds this process's pid. Two brokers on one directory would
/// each recover and write the same segment files and destroy them, so a
/// second one is refused, naming the holder's pid. The lock goes with the
/// process (the kernel releases a `flock` when its file closes), so a crash
/// leaves nothing to clean up; a stale pid in the file means nothing while
/// the file is unlocked.
fn lock_data_dir(dir: &Path) -> Result<std::fs::File, StartError> {
    use std::io::{Read, Seek, Write};
    let path = dir.join(LOCK_FILE);
    let io = |source| StartError::Io { path: path.display().to_string(), source };
    std::fs::create_dir_all(dir).map_err(|source| StartError::Io { path: dir.display().to_string(), source })?;
    let mut f =
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            // The holder writes its pid right after locking: an empty
            // file is a holder caught in between.
            let _ = f.read_to_string(&mut text);
            let pid = text.trim().parse::<u32>().ok();
            return Err(StartError::Locked { path: dir.display().to_string(), pid });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    f.set_len(0).map_err(io)?;
    f.rewind().map_err(io)?;
    writeln!(f, "{}", std::process::id()).map_err(io)?;
    Ok(f)
}

/// Checks (or, for a new directory, writes) the data directory's format file,
/// which records the shard count: topics live in the log of the shard owning
/// their bundle, so the count cannot change without moving data.
fn check_format_file(dir: &Path, shards: u32) -> Result<(), StartError> {
    let io = |source| StartError::Io { path: dir.display().to_string(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    let path = dir.join(FORMAT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let bad =
                |reason: &str| StartError::BadFormatFile { path: path.display().to_string(), reason: reason.into() };
            let mut version = None;
            let mut found = None;
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("format=") {
                    version = v.trim().parse::<u32>().ok();
                } else if let Some(v) = line.strip_prefix("shards=") {
                    found = v.trim().parse::<u32>().ok();
                }
            }
            if version != Some(DATA_FORMAT_VERSION) {
                return Err(bad("unknown format version"));
            }
            let found = found.ok_or_else(|| bad("no shards= line"))?;
            if found != shards {
                return Err(StartError::ShardCountMismatch { path: dir.display().to_string(), found });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let tmp = dir.join(format!("{FORMAT_FILE}.tmp"));
            let body = format!("format={DATA_FORMAT_VERSION}\nshards={shards}\n");
            let f = std::fs::File::create(&tmp).map_err(io)?;
            std::io::Write::write_all(&mut &f, body.as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
            std::fs::rename(&tmp, &path).map_err(io)?;
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
            Ok(())
        }
        Err(e) => Err(io(e)),
    }
}

/// Starts `config.shards` shards. Each, once every shard has recovered its
/// log, runs `serve(broker)` (the network layer's accept loop) until
/// `shutdown` is set, then shuts down cleanly. Returns once all shards are
/// serving, or the first start-up error (after stopping the others).
pub fn launch<F, Fut>(config: BrokerConfig, shutdown: Arc<AtomicBool>, serve: F) -> Result<Running, StartError>
where
    F: Fn(Broker) -> Fut + Send + Clone + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let n = config.shards;
    if n == 0 || n > SHARDS_MAX {
        return Err(StartError::Config(format!("shards must be 1..={SHARDS_MAX}, not {n}")));
    }
    // The storage layer opens directories through glommio, which fails on
    // relative paths ("./data" is the default): anchor the path here, once.
    let mut config = config;
    config.data_dir = std::path::absolute(&config.data_dir)
        .map_err(|source| StartError::Io { path: config.data_dir.display().to_string(), source })?;
    // Before anything else reads or writes the directory.
    let lock = lock_data_dir(&config.data_dir)?;
    check_format_file(&config.data_dir, n)?;
    let config = Arc::new(config);
    let cpus = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    let gate = Arc::new(super::start_gate::StartGate::<super::start_gate::ReleaseAcquire>::new(n));
    let (ready_tx, ready_rx) = mpsc::channel::<Result<u32, StartError>>();
    let mut handles = Vec::new();
    for (i, ends) in build_mesh(n).into_iter().enumerate() {
        let id = i as u32;
        let placement = if config.pin_cpus { Placement::Fixed(i % cpus) } else { Placement::Unbound };
        let (config, shutdown, gate, ready_tx, serve) =
            (config.clone(), shutdown.clone(), gate.clone(), ready_tx.clone(), serve.clone());
        let builder = LocalExecutorBuilder::new(placement).name(&format!("shard-{i}"));
        let handle = builder
            .spawn(move || async move {
                let (mesh, receivers) = Mesh::connect(n, ends).await;
                tracing::info!(shard = id, "mesh connected; opening the entry log");
                let mut lc = LogConfig::new(config.data_dir.join(format!("shard-{id}")));
                lc.segment_bytes = config.segment_bytes;
                lc.prezero_segments = config.prezero_segments;
                lc.zero_ahead_bytes = config.zero_ahead_bytes;
                lc.lone_sync_max = config.lone_sync_max;
                lc.recycle_segments = config.recycle_segments;
                lc.write_cache_bytes = config.write_cache_bytes;
                lc.index_cache_bytes = config.index_cache_bytes;
                lc.flush_bytes_max = config.flush_bytes_max;
                lc.allow_tmpfs = config.allow_tmpfs;
                lc.accept_data_loss = config.accept_data_loss;
                let (log, recovery) = match EntryLog::open_with(DmaDisk::new(config.lone_yield_max), lc).await {
                    Ok(x) => x,
                    Err(e) => {
                        // Damage inside data that may have been acknowledged:
                        // the operator decides (docs/reliability.md).
                        let hint = if e.is_acceptable_loss() {
                            "; nothing was changed on disk. To start anyway, truncating the log at the damage and \
                             logging what is dropped, restart with --accept-data-loss"
                        } else {
                            ""
                        };
                        let message = format!("opening the log failed: {e}{hint}");
                        tracing::error!(shard = id, "{message}");
                        let _ = ready_tx.send(Err(StartError::Shard { shard: id, message: message.clone() }));
                        return Err(message);
                    }
                };
                tracing::info!(
                    shard = id,
                    clean = recovery.clean,
                    scanned_bytes = recovery.scanned_bytes,
                    truncated_bytes = recovery.truncated_bytes,
                    entries_replayed = recovery.entries_replayed,
                    elapsed_ms = recovery.elapsed.as_millis() as u64,
                    "recovered entry log"
                );
                let shard = Shard::new(id, n, config.clone(), log, mesh);
                shard.metrics.recovery_us.set(recovery.elapsed.as_micros() as u64);
                if let Some(md) = &shard.metadata {
                    // A fresh data directory starts with tenant `public` and
                    // namespace `public/default` (shard 0 owns the metadata).
                    if let Err(e) = md.bootstrap().await {
                        let message = format!("creating the default tenant and namespace failed: {e}");
                        let _ = ready_tx.send(Err(StartError::Shard { shard: id, message: message.clone() }));
                        return Err(message);
                    }
                }
                for (_from, rx) in receivers {
                    let shard = shard.clone();
                    glommio::spawn_local(async move {
                        while let Some(msg) = rx.recv().await {
                            shard.on_mesh(msg);
                        }
                    })
                    .detach();
                }
                glommio::spawn_local(shard.clone().cursor_flusher()).detach();
                glommio::spawn_local(shard.clone().disk_watch()).detach();
                super::retention::spawn(shard.clone());
                super::unload::spawn(shard.clone());
                gate.arrive();
                // Serve only once every shard has recovered, so no request is
                // routed to a shard that is still reading its log.
                while gate.state(&shutdown) == super::start_gate::GateState::Waiting {
                    glommio::timer::sleep(Duration::from_millis(5)).await;
                }
                let serving = glommio::spawn_local(serve(Broker::new(shard.clone())));
                // Let the serve task run up to its first await (binding its
                // listener) before reporting this shard ready.
                futures_lite::future::yield_now().await;
                let _ = ready_tx.send(Ok(id));
                while !shutdown.load(Ordering::SeqCst) {
                    glommio::timer::sleep(Duration::from_millis(20)).await;
                }
                tracing::info!(shard = id, "shutting down");
                // A shutdown that could not close the log (e.g. a full
                // disk) ends the executor with its error, so the process
                // exits non-zero.
                let closed = shard.shutdown().await;
                drop(serving);
                closed
            })
            .map_err(|e| StartError::Shard { shard: id, message: format!("cannot start executor: {e}") })?;
        handles.push(handle);
    }
    drop(ready_tx);
    let running = Running { handles, shutdown: shutdown.clone(), _lock: lock };
    // Recovery of a large log can take a while: say which shards are still
    // starting every 10 s rather than waiting in silence.
    let started_at = std::time::Instant::now();
    let mut ready_shards = Vec::new();
    while ready_shards.len() < n as usize {
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(id)) => ready_shards.push(id),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let waiting: Vec<u32> = (0..n).filter(|i| !ready_shards.contains(i)).collect();
                tracing::warn!(
                    ?waiting,
                    elapsed_s = started_at.elapsed().as_secs(),
                    "still starting: waiting for shards (mesh connect or log recovery)"
                );
            }
            Ok(Err(e)) => {
                running.shutdown();
                let _ = running.join();
                return Err(e);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                running.shutdown();
                return Err(running.join().err().unwrap_or(StartError::Config("a shard exited during start".into())));
            }
        }
    }
    Ok(running)
}
