//! Harness for end-to-end tests: real `magnetar` processes on port 0 over
//! temporary data directories.
//!
//! - [`BrokerProcess`]: `magnetar standalone` as a child process (start, wait
//!   for the listening line, `kill9`, `terminate`, restart; killed on drop).
//! - [`ProduceCmd`], [`ConsumeCmd`], [`CliProcess`]: the CLI commands as child
//!   processes, with their `--output jsonl` records parsed ([`Receipt`],
//!   [`Received`]).
//! - [`run_with_timeout`] / [`run_async_with_timeout`]: every test body runs
//!   under a deadline; on timeout its processes and directories are removed.
//! - [`test_dir`], [`topics_per_shard`], [`expected_payload`],
//!   [`check_topic_log`], [`connect_on_shard`]: data helpers.
//! - [`consume`]: `receive` within a deadline, `assert_quiet`, `produce_one_batch`.
//! - [`RawConnection`]: a blocking raw-protocol connection for exact frames.
//! - [`run_pulsar_test`]: a test of the official Pulsar Python client
//!   (`tests/pulsar/`), in a venv made on first use ([`pulsar_python`]).
//! - [`run_console_test`]: the web console in headless chromium driven by
//!   Playwright (`tests/console/`), in a venv made on first use.
//!
//! See `README.md` for how it works and how to run one test.

mod broker;
mod browser;
mod cli;
pub mod consume;
mod data;
pub mod http;
mod process;
mod pulsar;
pub mod pulsar_raw;
mod python;
mod raw;
mod scope;

pub use broker::{
    BrokerOptions, BrokerProcess, StartFailure, HTTP_PREFIX, LISTENING_PREFIX, START_TIMEOUT, TERMINATE_TIMEOUT,
};
pub use browser::{chromium, console_artifacts_dir, console_python, console_tests_dir, run_console_test};
pub use cli::{run_cli, CliProcess, CliRun, ConsumeCmd, Line, ProduceCmd, Receipt, Received};
pub use data::{
    check_topic_log, expected_payload, owner_shard, parse_generated, test_dir, test_tmp_root, topics_per_shard,
    LogCheck, ProducedRun, TestDir, BUNDLES_PER_NAMESPACE,
};
pub use process::{magnetar_bin, ChildGuard, LogBuffer};
pub use pulsar::{pulsar_python, pulsar_tests_dir, run_pulsar_test, PulsarRun};
pub use python::{python_venv, run_python_test, target_dir, PythonRun};
pub use raw::{
    connect_frame, connect_frame_of, frame_bytes, message_blob, Ending, RawConnection, RawFrame, RAW_TIMEOUT,
};
pub use scope::{run_async_with_timeout, run_with_timeout, Scope};

use magnetar_client::Client;
use std::time::Duration;

/// Opens connections to `url` until one lands on `shard` (the kernel picks
/// the shard, SO_REUSEPORT hashing the connection's 4-tuple); the others are
/// closed. Panics after `attempts` connections on other shards. The client
/// is not shard-aware: its producers and consumers stay on this connection,
/// so requests for another shard's topics cross between shards (what these
/// tests exercise).
pub async fn connect_on_shard(url: &str, shard: u32, attempts: usize) -> Client {
    let mut seen = Vec::new();
    let options = magnetar_client::ClientOptions { shard_aware: false, ..Default::default() };
    for _ in 0..attempts {
        let client = tokio::time::timeout(Duration::from_secs(10), Client::connect_with(url, options.clone()))
            .await
            .unwrap_or_else(|_| panic!("connecting to {url} timed out"))
            .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
        let landed = client.server_info().shard;
        if landed == shard {
            return client;
        }
        seen.push(landed);
        client.close();
    }
    panic!("{attempts} connections to {url} never landed on shard {shard}; they landed on {seen:?}");
}

/// Seed of a randomized test: `MAGNETAR_TEST_SEED` if set (to replay a
/// failure), else a fresh one. Prints it either way.
pub fn test_seed(test: &str) -> u64 {
    let seed = match std::env::var("MAGNETAR_TEST_SEED") {
        Ok(s) => s.parse().unwrap_or_else(|_| panic!("MAGNETAR_TEST_SEED={s:?} is not a u64")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed),
    };
    eprintln!("{test}: seed {seed} (replay with MAGNETAR_TEST_SEED={seed})");
    seed
}

/// A small deterministic generator (splitmix64) for randomized tests.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the tiny modulo bias does not matter here).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next_u64() % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.next_u64() as u8;
        }
    }
}
