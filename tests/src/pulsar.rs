//! The official Apache Pulsar Python client, for the Pulsar door's tests.
//!
//! [`pulsar_python`] makes a virtual environment with the pinned
//! `pulsar-client` wheel (`tests/pulsar/requirements.txt`) on first use
//! ([`python_venv`]). [`run_pulsar_test`] runs one test of
//! `tests/pulsar/client_tests.py` under a hard timeout.

use crate::python::{python_venv, run_python_test, PythonRun};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The directory of the Python tests and their requirements.
pub fn pulsar_tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("pulsar")
}

/// The venv's Python with the pinned `pulsar-client` installed.
pub fn pulsar_python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| python_venv("pulsar", &pulsar_tests_dir().join("requirements.txt"), "pulsar"))
}

/// What one Python test printed.
pub type PulsarRun = PythonRun;

/// Runs `client_tests.py URL NAME TOPIC ARGS...`; panics (with its output)
/// unless it passes within `timeout`, after which it is killed.
pub fn run_pulsar_test(url: &str, name: &str, topic: &str, args: &[&str], timeout: Duration) -> PulsarRun {
    let script = pulsar_tests_dir().join("client_tests.py");
    let mut all = vec![url, name, topic];
    all.extend_from_slice(args);
    run_python_test(pulsar_python(), &script, &all, name, &[], timeout)
}
