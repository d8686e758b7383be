//! A `magnetar standalone` broker as a child process.

use crate::process::{magnetar_bin, pump_lines, ChildGuard, LogBuffer};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

/// The line the broker prints on stdout once every shard serves.
pub const LISTENING_PREFIX: &str = "magnetar standalone listening on ";
/// The line the broker prints on stdout, before the listening line, with
/// its HTTP server's address.
pub const HTTP_PREFIX: &str = "magnetar standalone http on ";
/// How long a broker may take to recover its log and start serving.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a clean shutdown may take (drain, sync, clean marker).
pub const TERMINATE_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start a broker beyond data dir and shard count.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    pub shards: u32,
    /// Pin shards to CPUs (the production default). Off by default in tests:
    /// several brokers of parallel tests share two cores.
    pub pin_cpus: bool,
    /// `--segment-mib`; `None` keeps the broker's default.
    pub segment_mib: Option<u64>,
    /// `--write-cache-mib`; small by default so parallel brokers stay light.
    pub write_cache_mib: Option<u64>,
    /// `RUST_LOG` of the broker (`MAGNETAR_TEST_RUST_LOG` overrides it).
    pub rust_log: String,
    /// More arguments after the standard ones.
    pub extra_args: Vec<String>,
}

impl BrokerOptions {
    pub fn new(shards: u32) -> Self {
        Self {
            shards,
            pin_cpus: false,
            segment_mib: None,
            write_cache_mib: Some(32),
            rust_log: "info".into(),
            extra_args: Vec::new(),
        }
    }
}

/// A broker that failed to start.
#[derive(Debug)]
pub struct StartFailure {
    /// `None` when it did not exit but never printed the listening line in time.
    pub status: Option<ExitStatus>,
    pub stderr: String,
    pub reason: String,
}

impl std::fmt::Display for StartFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "broker did not start: {} (exit: {:?})\n--- broker stderr (tail) ---\n{}",
            self.reason, self.status, self.stderr
        )
    }
}

/// A running `magnetar standalone` process. Dropping it kills it (SIGKILL).
///
/// The broker's stderr (its log) is captured; [`BrokerProcess::log`] returns
/// it, and panics from this harness include its tail. Set
/// `MAGNETAR_TEST_ECHO=1` to see it live.
pub struct BrokerProcess {
    child: ChildGuard,
    addr: SocketAddr,
    /// The HTTP server's address (`None` with `--no-http`).
    http_addr: Option<SocketAddr>,
    data_dir: PathBuf,
    options: BrokerOptions,
    log: LogBuffer,
    /// The stderr pump; joined after the process ended so the log is complete.
    log_pump: Option<std::thread::JoinHandle<()>>,
}

impl BrokerProcess {
    /// Starts a broker on `127.0.0.1:0` with `shards` shards over `data_dir`
    /// and waits (up to [`START_TIMEOUT`]) for its listening line. Panics with
    /// the broker's stderr if it does not start.
    pub fn start(data_dir: &Path, shards: u32) -> BrokerProcess {
        Self::start_with(data_dir, &BrokerOptions::new(shards))
    }

    pub fn start_with(data_dir: &Path, options: &BrokerOptions) -> BrokerProcess {
        Self::try_start_with(data_dir, options).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`start`](Self::start), but a broker that exits or does not
    /// become ready is returned as an error (e.g. to test a refused start).
    pub fn try_start(data_dir: &Path, shards: u32) -> Result<BrokerProcess, StartFailure> {
        Self::try_start_with(data_dir, &BrokerOptions::new(shards))
    }

    /// Starts a broker on `data_dir` and `kill -9`s it `after` its spawn,
    /// ready or not (a kill during recovery when `after` is short). Returns
    /// whether it had printed its listening line by then.
    pub fn start_and_kill9_after(data_dir: &Path, options: &BrokerOptions, after: Duration) -> bool {
        let mut cmd = Self::command(data_dir, options);
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = ChildGuard::spawn(cmd).unwrap_or_else(|e| panic!("spawning {}: {e}", magnetar_bin().display()));
        let lines =
            pump_lines(child.child_mut().stdout.take().expect("piped stdout"), format!("broker-{}", child.pid()));
        std::thread::sleep(after);
        child.kill9();
        // The pipe closed with the process, so the pump ends and this returns.
        lines.iter().any(|l| l.starts_with(LISTENING_PREFIX))
    }

    /// Starts a broker on `data_dir` without waiting for it to be ready:
    /// the process (killed when dropped) and its stdout lines as they come
    /// (its HTTP address line comes before recovery, its listening line
    /// after). For tests of what the broker says while it recovers.
    pub fn spawn_starting(data_dir: &Path, options: &BrokerOptions) -> (ChildGuard, std::sync::mpsc::Receiver<String>) {
        let mut cmd = Self::command(data_dir, options);
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = ChildGuard::spawn(cmd).unwrap_or_else(|e| panic!("spawning {}: {e}", magnetar_bin().display()));
        let lines =
            pump_lines(child.child_mut().stdout.take().expect("piped stdout"), format!("broker-{}", child.pid()));
        (child, lines)
    }

    fn command(data_dir: &Path, options: &BrokerOptions) -> Command {
        let mut cmd = Command::new(magnetar_bin());
        cmd.arg("standalone")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--shards")
            .arg(options.shards.to_string());
        if !options.pin_cpus {
            cmd.arg("--no-pin");
        }
        // These tests are not about disk watermarks (core/tests/watermarks.rs
        // is): refuse produce only on a completely full disk, so that a busy
        // development disk above 90 % does not fail them.
        cmd.arg("--disk-refuse-pct").arg("100");
        if let Some(m) = options.segment_mib {
            cmd.arg("--segment-mib").arg(m.to_string());
        }
        if let Some(m) = options.write_cache_mib {
            cmd.arg("--write-cache-mib").arg(m.to_string());
        }
        // Brokers of parallel tests must not share the default HTTP port.
        if !options.extra_args.iter().any(|a| a == "--http-listen" || a == "--no-http") {
            cmd.arg("--http-listen").arg("127.0.0.1:0");
        }
        cmd.args(&options.extra_args);
        let rust_log = std::env::var("MAGNETAR_TEST_RUST_LOG").unwrap_or_else(|_| options.rust_log.clone());
        cmd.env("RUST_LOG", rust_log).env("NO_COLOR", "1").stdin(Stdio::null());
        cmd
    }

    pub fn try_start_with(data_dir: &Path, options: &BrokerOptions) -> Result<BrokerProcess, StartFailure> {
        let mut cmd = Self::command(data_dir, options);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = ChildGuard::spawn(cmd).unwrap_or_else(|e| panic!("spawning {}: {e}", magnetar_bin().display()));
        let label = format!("broker-{}", child.pid());
        let log = LogBuffer::default();
        let stderr = child.child_mut().stderr.take().expect("piped stderr");
        let log_pump = Some(log.pump(stderr, label.clone()));
        let stdout = child.child_mut().stdout.take().expect("piped stdout");
        let lines = pump_lines(stdout, label);

        let deadline = Instant::now() + START_TIMEOUT;
        let mut http_addr = None;
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(HTTP_PREFIX) {
                        http_addr = rest.trim().parse::<SocketAddr>().ok();
                        continue;
                    }
                    if let Some(rest) = line.strip_prefix(LISTENING_PREFIX) {
                        match rest.trim().parse::<SocketAddr>() {
                            Ok(a) => break a,
                            Err(e) => {
                                child.kill9();
                                return Err(StartFailure {
                                    status: None,
                                    stderr: log.tail(),
                                    reason: format!("cannot parse the address in {line:?}: {e}"),
                                });
                            }
                        }
                    }
                    // Anything else on stdout is unexpected but harmless.
                    eprintln!("broker stdout: {line}");
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // stdout closed: the process is exiting.
                    let status = child.wait_timeout(Duration::from_secs(10)).or_else(|| Some(child.kill9()));
                    if let Some(pump) = log_pump {
                        let _ = pump.join();
                    }
                    return Err(StartFailure {
                        status,
                        stderr: log.tail(),
                        reason: "it exited before printing its listening line".into(),
                    });
                }
                Err(RecvTimeoutError::Timeout) => {
                    child.kill9();
                    return Err(StartFailure {
                        status: None,
                        stderr: log.tail(),
                        reason: format!("no listening line within {START_TIMEOUT:?}"),
                    });
                }
            }
        };
        // The stdout pump keeps draining until EOF; nothing more is expected.
        Ok(BrokerProcess {
            child,
            addr,
            http_addr,
            data_dir: data_dir.to_path_buf(),
            options: options.clone(),
            log,
            log_pump,
        })
    }

    /// Starts a new broker on the same data directory with the same options
    /// (after [`kill9`](Self::kill9) or [`terminate`](Self::terminate)).
    /// The port changes.
    pub fn restart(&self) -> BrokerProcess {
        Self::start_with(&self.data_dir, &self.options)
    }

    /// The address the broker listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The HTTP server's address; panics when it was started with `--no-http`.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr.expect("the broker runs no HTTP server")
    }

    /// `HOST:PORT`, as the CLI's `--url` and `Client::connect` take it.
    pub fn url(&self) -> String {
        self.addr.to_string()
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn shards(&self) -> u32 {
        self.options.shards
    }

    /// The broker's stderr so far.
    pub fn log(&self) -> String {
        self.log.text()
    }

    /// The last few KiB of stderr, for assertion messages.
    pub fn log_tail(&self) -> String {
        self.log.tail()
    }

    /// Whether the process is still running (reaps it if it ended).
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().is_none()
    }

    /// Panics (with the log tail) if the broker has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait() {
            panic!("broker exited unexpectedly ({status})\n--- broker stderr (tail) ---\n{}", self.log.tail());
        }
    }

    /// `kill -9`: no chance to sync or write anything.
    pub fn kill9(&mut self) -> ExitStatus {
        let status = self.child.kill9();
        self.join_log_pump();
        status
    }

    /// After the process ended, its stderr reaches EOF: wait for the pump so
    /// that [`log`](Self::log) holds the last lines.
    fn join_log_pump(&mut self) {
        if let Some(pump) = self.log_pump.take() {
            let _ = pump.join();
        }
    }

    /// SIGTERM, then wait up to `timeout` for the exit; on timeout the process
    /// is killed and this panics with the log tail.
    pub fn terminate_within(&mut self, timeout: Duration) -> ExitStatus {
        self.child.signal(nix::sys::signal::Signal::SIGTERM);
        match self.child.wait_timeout(timeout) {
            Some(status) => {
                self.join_log_pump();
                status
            }
            None => {
                self.child.kill9();
                panic!(
                    "broker did not exit within {timeout:?} of SIGTERM\n--- broker stderr (tail) ---\n{}",
                    self.log.tail()
                );
            }
        }
    }

    /// Sends SIGTERM (a graceful shutdown) without waiting.
    pub fn sigterm(&mut self) {
        self.child.signal(nix::sys::signal::Signal::SIGTERM);
    }

    /// SIGTERM and wait (up to [`TERMINATE_TIMEOUT`]).
    pub fn terminate(&mut self) -> ExitStatus {
        self.terminate_within(TERMINATE_TIMEOUT)
    }
}
