//! The web console's browser tests (`tests/console/`): Debian's `chromium`
//! driven headless by the pinned Playwright for Python, in a venv made on
//! first use. Playwright never downloads a browser here: it is given the
//! system's chromium. Without one the test fails saying so (`.ci/run`
//! installs it).

use crate::python::{python_venv, run_python_test, target_dir, PythonRun};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The directory of the browser script and its requirements.
pub fn console_tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("console")
}

/// Where the browser tests write their screenshots (test artifacts).
pub fn console_artifacts_dir() -> PathBuf {
    target_dir().join("console-screenshots")
}

/// The system's chromium (`CHROMIUM` overrides); panics saying how to
/// install it when there is none.
pub fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(p);
    }
    for p in ["/usr/bin/chromium", "/usr/bin/chromium-browser"] {
        if Path::new(p).is_file() {
            return PathBuf::from(p);
        }
    }
    panic!(
        "no chromium: the console's browser tests need Debian's chromium \
         (`apt-get install -y chromium`, as .ci/run does) or CHROMIUM=/path/to/chromium"
    )
}

/// The venv's Python with the pinned Playwright installed.
pub fn console_python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| python_venv("console", &console_tests_dir().join("requirements.txt"), "playwright"))
}

/// Runs `console_tests.py NAME BASE_URL ARTIFACTS ARGS...` in the browser;
/// panics (with its output) unless it passes within `timeout`.
pub fn run_console_test(name: &str, base_url: &str, args: &[&str], timeout: Duration) -> PythonRun {
    let browser = chromium();
    let artifacts = console_artifacts_dir();
    let artifacts = artifacts.to_string_lossy();
    let mut all = vec![name, base_url, &artifacts];
    all.extend_from_slice(args);
    let script = console_tests_dir().join("console_tests.py");
    let browser = browser.to_string_lossy();
    run_python_test(console_python(), &script, &all, name, &[("CHROMIUM", &browser)], timeout)
}
