//! A broker the bench starts itself: `magnetar standalone` from the same
//! target directory, on a free port, over a fresh data directory on the real
//! disk (never tmpfs: the point is to measure durable appends).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error(
        "no broker binary at {0}: build it with `cargo build --release -p magnetar -p magnetar-bench`, pass --broker-bin, or --url for a running broker"
    )]
    Missing(PathBuf),
    #[error("cannot create the data directory under {dir}: {source}")]
    DataDir { dir: PathBuf, source: std::io::Error },
    #[error("cannot start {bin}: {source}")]
    Spawn { bin: PathBuf, source: std::io::Error },
    #[error("the broker did not announce its address within {after:?}; its stderr ends with:\n{stderr}")]
    NoAddress { after: Duration, stderr: String },
}

/// Options of a self-started broker.
#[derive(Debug, Clone, Default)]
pub struct BrokerOptions {
    /// `magnetar` binary; default: beside this executable.
    pub bin: Option<PathBuf>,
    /// Parent of the temporary data directory; default `<target>/bench-data`.
    pub data_parent: Option<PathBuf>,
    pub shards: Option<u32>,
    pub no_pin: bool,
    /// More arguments for `magnetar standalone`.
    pub extra_args: Vec<String>,
}

/// A running `magnetar standalone`; stopped (SIGTERM, then kill) and its
/// data directory removed on drop.
pub struct BrokerProcess {
    child: Child,
    pub addr: String,
    pub bin: PathBuf,
    pub data_dir: PathBuf,
    _dir: tempfile::TempDir,
    stderr_tail: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

/// The target directory this executable lives in (`<target>/<profile>/x` or
/// `<target>/<profile>/deps/x`).
pub fn exe_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.to_path_buf();
    Some(if dir.ends_with("deps") { dir.parent()?.to_path_buf() } else { dir })
}

impl BrokerProcess {
    pub fn start(options: &BrokerOptions) -> Result<BrokerProcess, BrokerError> {
        let profile_dir = exe_dir().unwrap_or_else(|| PathBuf::from("."));
        let bin = options.bin.clone().unwrap_or_else(|| profile_dir.join("magnetar"));
        if !bin.is_file() {
            return Err(BrokerError::Missing(bin));
        }
        let parent = options
            .data_parent
            .clone()
            .unwrap_or_else(|| profile_dir.parent().unwrap_or(Path::new(".")).join("bench-data"));
        std::fs::create_dir_all(&parent).map_err(|source| BrokerError::DataDir { dir: parent.clone(), source })?;
        let dir = tempfile::Builder::new()
            .prefix("run-")
            .tempdir_in(&parent)
            .map_err(|source| BrokerError::DataDir { dir: parent.clone(), source })?;
        let data_dir = dir.path().join("data");
        let mut cmd = Command::new(&bin);
        cmd.arg("standalone")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--http-listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&data_dir);
        if let Some(shards) = options.shards {
            cmd.arg("--shards").arg(shards.to_string());
        }
        if options.no_pin {
            cmd.arg("--no-pin");
        }
        cmd.args(&options.extra_args);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|source| BrokerError::Spawn { bin: bin.clone(), source })?;

        // Drain stderr into a bounded tail so a chatty broker never blocks.
        let stderr_tail = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        if let Some(mut stderr) = child.stderr.take() {
            let tail = stderr_tail.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stderr.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    t.extend_from_slice(&buf[..n]);
                    let excess = t.len().saturating_sub(16 * 1024);
                    t.drain(..excess);
                }
            });
        }
        let (tx, rx) = mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if let Some(addr) = line.strip_prefix("magnetar standalone listening on ") {
                        let _ = tx.send(addr.trim().to_string());
                    }
                }
            });
        }
        let after = Duration::from_secs(60);
        let mut broker = BrokerProcess { child, addr: String::new(), bin, data_dir, _dir: dir, stderr_tail };
        match rx.recv_timeout(after) {
            Ok(addr) => {
                broker.addr = addr;
                Ok(broker)
            }
            Err(_) => Err(BrokerError::NoAddress { after, stderr: broker.stderr_tail() }),
        }
    }

    pub fn stderr_tail(&self) -> String {
        String::from_utf8_lossy(&self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, wait up to 10 s for a clean exit, then SIGKILL.
    pub fn stop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
        }
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}
