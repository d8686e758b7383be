//! Python helpers of the end-to-end tests: a virtual environment with
//! pinned packages made on first use, and one test of a Python script run
//! under a hard timeout.
//!
//! [`python_venv`] makes the venv under the target directory, once per
//! machine and requirements file (a file lock keeps parallel tests from
//! building it twice; its name follows the file, so a new pin makes a new
//! one). If it cannot be made (no `python3`, no PyPI), the test fails
//! saying why: it never passes without running.

use crate::process::magnetar_bin;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The target directory (`target/`), where venvs and artifacts go.
pub fn target_dir() -> PathBuf {
    magnetar_bin().parent().and_then(Path::parent).unwrap_or_else(|| Path::new(".")).to_path_buf()
}

/// The Python of a venv `NAME-venv-<crc of requirements>` with
/// `requirements` installed; `import` is checked to load in it.
pub fn python_venv(name: &str, requirements: &Path, import: &str) -> PathBuf {
    let pinned =
        std::fs::read_to_string(requirements).unwrap_or_else(|e| panic!("reading {}: {e}", requirements.display()));
    let tag = crc32fast::hash(pinned.as_bytes());
    let target = target_dir();
    let venv = target.join(format!("{name}-venv-{tag:08x}"));
    let python = venv.join("bin").join("python");
    let ready = venv.join("ready");
    if ready.is_file() {
        return python;
    }
    let lock_path = target.join(format!("{name}-venv-{tag:08x}.lock"));
    let lock = std::fs::File::create(&lock_path).unwrap_or_else(|e| panic!("creating {}: {e}", lock_path.display()));
    lock.lock().unwrap_or_else(|e| panic!("locking {}: {e}", lock_path.display()));
    if ready.is_file() {
        return python;
    }
    let _ = std::fs::remove_dir_all(&venv);
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
        assert!(
            out.status.success(),
            "{what} failed ({}): these tests need python3 with venv and PyPI access\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv), "python3 -m venv");
    run(
        Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(requirements),
        &format!("pip install -r {}", requirements.display()),
    );
    run(Command::new(&python).args(["-c", &format!("import {import}")]), &format!("import {import}"));
    std::fs::write(&ready, pinned).unwrap_or_else(|e| panic!("writing {}: {e}", ready.display()));
    python
}

/// What one Python test printed.
#[derive(Debug)]
pub struct PythonRun {
    /// Lines printed with the `OUT ` prefix, without it.
    pub out: Vec<String>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `PYTHON SCRIPT ARGS...` with `envs`, the test `name`; panics (with
/// its output) unless it exits 0 having printed `PASSED NAME` within
/// `timeout`, after which it is killed.
pub fn run_python_test(
    python: &Path,
    script: &Path,
    args: &[&str],
    name: &str,
    envs: &[(&str, &str)],
    timeout: Duration,
) -> PythonRun {
    let mut child = Command::new(python)
        .arg(script)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", python.display()));
    let (mut so, mut se) = (child.stdout.take(), child.stderr.take());
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = so.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(e) = se.as_mut() {
            let _ = e.read_to_string(&mut s);
        }
        s
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap_or_else(|e| panic!("waiting for python: {e}")) {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    let tail = |s: &str| s.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    match status {
        None => panic!(
            "Python test {name} timed out after {timeout:?}\nstdout:\n{}\nstderr:\n{}",
            tail(&stdout),
            tail(&stderr)
        ),
        Some(s) if !s.success() => {
            panic!("Python test {name} failed ({s})\nstdout:\n{}\nstderr:\n{}", tail(&stdout), tail(&stderr))
        }
        Some(_) => {}
    }
    assert!(stdout.contains(&format!("PASSED {name}")), "Python test {name} did not finish:\n{stdout}");
    let out = stdout.lines().filter_map(|l| l.strip_prefix("OUT ")).map(str::to_string).collect();
    PythonRun { out, stdout, stderr }
}
