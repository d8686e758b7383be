//! The `magnetar produce` / `magnetar consume` commands as child processes,
//! and their `--output jsonl` records.

use crate::process::{magnetar_bin, pump_lines, ChildGuard, LogBuffer};
use base64::Engine as _;
use magnetar_wire::MessageId;
use std::ffi::OsString;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// What [`CliProcess::next_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    Line(String),
    /// stdout closed (the process is exiting).
    Eof,
    Timeout,
}

/// A running CLI command whose stdout lines are read as they come. Dropping
/// it kills the process.
pub struct CliProcess {
    child: ChildGuard,
    lines: Receiver<String>,
    stderr: LogBuffer,
    stderr_pump: Option<std::thread::JoinHandle<()>>,
    args: Vec<OsString>,
}

/// A finished CLI command.
#[derive(Debug)]
pub struct CliRun {
    pub status: ExitStatus,
    pub stdout_lines: Vec<String>,
    pub stderr: String,
    /// The command line, for messages.
    pub args: String,
}

impl CliRun {
    /// Panics with the command line and stderr unless it exited with 0.
    pub fn assert_success(&self) -> &Self {
        assert!(
            self.status.success(),
            "magnetar {} exited with {}\n--- stderr ---\n{}",
            self.args,
            self.status,
            self.stderr
        );
        self
    }
}

impl CliProcess {
    /// Starts `magnetar ARGS…` with stdout and stderr piped.
    pub fn spawn<I, S>(args: I) -> CliProcess
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let mut cmd = Command::new(magnetar_bin());
        cmd.args(&args)
            .env("RUST_LOG", std::env::var("MAGNETAR_TEST_CLI_RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = ChildGuard::spawn(cmd).unwrap_or_else(|e| panic!("spawning magnetar {args:?}: {e}"));
        let label = format!("cli-{}", child.pid());
        let stderr = LogBuffer::default();
        let pump = stderr.pump(child.child_mut().stderr.take().expect("piped stderr"), label.clone());
        let lines = pump_lines(child.child_mut().stdout.take().expect("piped stdout"), label);
        CliProcess { child, lines, stderr, stderr_pump: Some(pump), args }
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The command line, for messages.
    pub fn args_text(&self) -> String {
        self.args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ")
    }

    /// The next stdout line, waiting up to `timeout`.
    pub fn next_line(&mut self, timeout: Duration) -> Line {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Line::Line(l),
            Err(RecvTimeoutError::Disconnected) => Line::Eof,
            Err(RecvTimeoutError::Timeout) => Line::Timeout,
        }
    }

    /// stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    /// Reads the remaining stdout to EOF and waits for the exit, all within
    /// `timeout`; on timeout kills the process and panics with its stderr.
    pub fn finish(mut self, timeout: Duration) -> CliRun {
        let deadline = Instant::now() + timeout;
        let mut stdout_lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_line(left) {
                Line::Line(l) => stdout_lines.push(l),
                Line::Eof => break,
                Line::Timeout => self.timed_out(timeout),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let status = match self.child.wait_timeout(left.max(Duration::from_millis(100))) {
            Some(s) => s,
            None => self.timed_out(timeout),
        };
        if let Some(p) = self.stderr_pump.take() {
            let _ = p.join();
        }
        CliRun { status, stdout_lines, stderr: self.stderr.text(), args: self.args_text() }
    }

    fn timed_out(&mut self, timeout: Duration) -> ! {
        self.child.kill9();
        panic!(
            "magnetar {} did not finish within {timeout:?}\n--- stderr ---\n{}",
            self.args_text(),
            self.stderr.tail()
        );
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) -> ExitStatus {
        self.child.kill9()
    }
}

/// Runs `magnetar ARGS…` to completion (at most `timeout`).
pub fn run_cli<I, S>(args: I, timeout: Duration) -> CliRun
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    CliProcess::spawn(args).finish(timeout)
}

/// Arguments of `magnetar produce` with generated payloads and jsonl output.
#[derive(Debug, Clone)]
pub struct ProduceCmd {
    pub url: String,
    pub topic: String,
    pub producer_name: String,
    pub count: u64,
    pub size: usize,
    pub max_pending: u64,
    pub extra_args: Vec<String>,
}

impl ProduceCmd {
    pub fn new(url: &str, topic: &str, producer_name: &str, count: u64, size: usize) -> Self {
        Self {
            url: url.into(),
            topic: topic.into(),
            producer_name: producer_name.into(),
            count,
            size,
            max_pending: 100,
            extra_args: Vec::new(),
        }
    }

    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "produce".into(),
            self.topic.clone(),
            "--count".into(),
            self.count.to_string(),
            "--size".into(),
            self.size.to_string(),
            "--url".into(),
            self.url.clone(),
            "--output".into(),
            "jsonl".into(),
            "--producer-name".into(),
            self.producer_name.clone(),
            "--max-pending".into(),
            self.max_pending.to_string(),
        ];
        a.extend(self.extra_args.iter().cloned());
        a
    }

    pub fn spawn(&self) -> CliProcess {
        CliProcess::spawn(self.args())
    }

    /// Runs to completion; asserts exit 0 and one receipt per message, in seq
    /// order from 0.
    pub fn run(&self, timeout: Duration) -> Vec<Receipt> {
        let run = run_cli(self.args(), timeout);
        run.assert_success();
        let receipts: Vec<Receipt> = run.stdout_lines.iter().map(|l| Receipt::parse(l)).collect();
        assert_eq!(receipts.len() as u64, self.count, "receipts of magnetar {}\n{}", run.args, run.stderr);
        for (i, r) in receipts.iter().enumerate() {
            assert_eq!(r.seq, i as u64, "receipts out of seq order: {r:?}");
        }
        receipts
    }
}

/// Arguments of `magnetar consume` with jsonl output.
#[derive(Debug, Clone)]
pub struct ConsumeCmd {
    pub url: String,
    pub topic: String,
    pub subscription: String,
    /// `--count`; 0 = until the idle timeout.
    pub count: u64,
    pub earliest: bool,
    /// `--timeout-s`: stop after this long without a message.
    pub idle_timeout_s: f64,
    pub extra_args: Vec<String>,
}

impl ConsumeCmd {
    pub fn new(url: &str, topic: &str, subscription: &str) -> Self {
        Self {
            url: url.into(),
            topic: topic.into(),
            subscription: subscription.into(),
            count: 0,
            earliest: true,
            idle_timeout_s: 3.0,
            extra_args: Vec::new(),
        }
    }

    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "consume".into(),
            self.topic.clone(),
            "--subscription".into(),
            self.subscription.clone(),
            "--count".into(),
            self.count.to_string(),
            "--initial-position".into(),
            if self.earliest { "earliest" } else { "latest" }.into(),
            "--timeout-s".into(),
            self.idle_timeout_s.to_string(),
            "--url".into(),
            self.url.clone(),
            "--output".into(),
            "jsonl".into(),
        ];
        a.extend(self.extra_args.iter().cloned());
        a
    }

    pub fn spawn(&self) -> CliProcess {
        CliProcess::spawn(self.args())
    }

    /// Runs to completion; asserts exit 0.
    pub fn run(&self, timeout: Duration) -> Vec<Received> {
        let run = run_cli(self.args(), timeout);
        run.assert_success();
        run.stdout_lines.iter().map(|l| Received::parse(l)).collect()
    }
}

/// One line of `magnetar produce --output jsonl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    pub seq: u64,
    pub id: MessageId,
    pub key: Option<String>,
}

fn field<'a>(v: &'a serde_json::Value, name: &str, line: &str) -> &'a serde_json::Value {
    v.get(name).unwrap_or_else(|| panic!("no {name:?} in {line}"))
}

fn opt_string(v: &serde_json::Value, name: &str, line: &str) -> Option<String> {
    match field(v, name, line) {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => panic!("{name:?} is {other} in {line}"),
    }
}

fn u64_field(v: &serde_json::Value, name: &str, line: &str) -> u64 {
    field(v, name, line).as_u64().unwrap_or_else(|| panic!("{name:?} is not a u64 in {line}"))
}

fn id_field(v: &serde_json::Value, line: &str) -> MessageId {
    let s = field(v, "id", line).as_str().unwrap_or_else(|| panic!("\"id\" is not a string in {line}"));
    s.parse().unwrap_or_else(|e| panic!("{e} in {line}"))
}

impl Receipt {
    /// Parses one jsonl line; panics (naming the line) if it breaks the contract.
    pub fn parse(line: &str) -> Receipt {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        Receipt { seq: u64_field(&v, "seq", line), id: id_field(&v, line), key: opt_string(&v, "key", line) }
    }
}

/// One line of `magnetar consume --output jsonl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub id: MessageId,
    pub key: Option<String>,
    pub properties: Vec<(String, String)>,
    pub publish_time_ms: u64,
    pub receive_time_ms: u64,
    pub redelivery_count: u64,
    /// `deliver_at_ms`, present only for a message sent with a delivery time.
    pub deliver_at_ms: Option<u64>,
    /// From `payload` (UTF-8) or `payload_base64`.
    pub payload: Vec<u8>,
}

impl Received {
    /// Parses one jsonl line; panics (naming the line) if it breaks the contract.
    pub fn parse(line: &str) -> Received {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let properties = match field(&v, "properties", line) {
            serde_json::Value::Object(m) => m
                .iter()
                .map(|(k, v)| {
                    let v = v.as_str().unwrap_or_else(|| panic!("property {k:?} is not a string in {line}"));
                    (k.clone(), v.to_string())
                })
                .collect(),
            other => panic!("\"properties\" is {other} in {line}"),
        };
        let payload = match (v.get("payload"), v.get("payload_base64")) {
            (Some(serde_json::Value::String(s)), None) => s.as_bytes().to_vec(),
            (None, Some(serde_json::Value::String(b))) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .unwrap_or_else(|e| panic!("bad payload_base64 ({e}) in {line}")),
            _ => panic!("exactly one of \"payload\" and \"payload_base64\" must be a string in {line}"),
        };
        Received {
            id: id_field(&v, line),
            key: opt_string(&v, "key", line),
            properties,
            publish_time_ms: u64_field(&v, "publish_time_ms", line),
            receive_time_ms: u64_field(&v, "receive_time_ms", line),
            redelivery_count: u64_field(&v, "redelivery_count", line),
            deliver_at_ms: v.get("deliver_at_ms").map(|_| u64_field(&v, "deliver_at_ms", line)),
            payload,
        }
    }
}
