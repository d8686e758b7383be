//! Child processes: the `magnetar` binary, a guard that kills and reaps it,
//! and pumps that drain its stdout and stderr.

use crate::scope::{self, Scope};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Captured stderr beyond this is dropped from the front (the tail of a log
/// is what explains a failure).
const STDERR_KEEP_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Shown in panic messages.
pub(crate) const STDERR_SHOWN_BYTES_MAX: usize = 16 * 1024;

/// The `magnetar` binary the tests run.
///
/// `MAGNETAR_BIN` names one explicitly. Otherwise it is the one cargo builds
/// beside the test executable: `current_exe()` is
/// `<target>/<profile>/deps/<test>-<hash>`, so the binary is
/// `<target>/<profile>/magnetar`. `cargo test -p magnetar-tests` does not
/// build other packages' binaries, and an old binary would silently test old
/// code, so the first call in each test executable runs
/// `cargo build -p magnetar --bin magnetar` for that target dir and profile
/// (a no-op when it is up to date; cargo does not hold its build lock while
/// tests run). `MAGNETAR_TEST_NO_BUILD=1` skips the build and only requires
/// the binary to exist.
pub fn magnetar_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(locate_or_build)
}

fn locate_or_build() -> PathBuf {
    if let Some(p) = std::env::var_os("MAGNETAR_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "MAGNETAR_BIN={} is not a file", p.display());
        return p;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("cannot find the profile dir above {}", exe.display()))
        .to_path_buf();
    let bin = profile_dir.join("magnetar");
    if std::env::var_os("MAGNETAR_TEST_NO_BUILD").is_some_and(|v| v == "1") {
        assert!(bin.is_file(), "MAGNETAR_TEST_NO_BUILD=1 but {} does not exist", bin.display());
        return bin;
    }
    let target_dir = profile_dir.parent().expect("target dir above the profile dir");
    let profile = match profile_dir.file_name().and_then(OsStr::to_str) {
        Some("debug") => "dev",
        Some(other) => other,
        None => panic!("odd profile dir {}", profile_dir.display()),
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    let out = Command::new(&cargo)
        .args(["build", "--quiet", "-p", "magnetar", "--bin", "magnetar", "--profile", profile])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(target_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cargo:?} build: {e}"));
    assert!(
        out.status.success(),
        "building the magnetar binary failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        bin.is_file(),
        "cargo built magnetar but {} does not exist (cross-compiling? set MAGNETAR_BIN)",
        bin.display()
    );
    if started.elapsed() > Duration::from_secs(5) {
        eprintln!("built {} in {:.1} s", bin.display(), started.elapsed().as_secs_f64());
    }
    bin
}

/// A bounded, shared copy of a child's stderr, filled by a pump thread.
#[derive(Clone, Default)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    fn push(&self, bytes: &[u8]) {
        let mut buf = self.0.lock().unwrap_or_else(|e| e.into_inner());
        buf.extend_from_slice(bytes);
        if buf.len() > STDERR_KEEP_BYTES_MAX {
            let cut = buf.len() - STDERR_KEEP_BYTES_MAX / 2;
            buf.drain(..cut);
        }
    }

    /// Everything kept so far, lossily decoded.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// The last `STDERR_SHOWN_BYTES_MAX` bytes, for panic messages.
    pub fn tail(&self) -> String {
        let text = self.text();
        let mut start = text.len().saturating_sub(STDERR_SHOWN_BYTES_MAX);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].to_string()
    }

    /// Starts a thread that copies `src` into the buffer until EOF; with
    /// `echo` set (`MAGNETAR_TEST_ECHO=1`), also to our stderr with a prefix.
    pub(crate) fn pump(&self, src: impl Read + Send + 'static, label: String) -> std::thread::JoinHandle<()> {
        let me = self.clone();
        let echo = std::env::var_os("MAGNETAR_TEST_ECHO").is_some_and(|v| v == "1");
        std::thread::Builder::new()
            .name(format!("{label}-stderr"))
            .spawn(move || {
                let mut reader = BufReader::new(src);
                let mut line = Vec::new();
                loop {
                    line.clear();
                    match reader.read_until(b'\n', &mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {
                            if echo {
                                eprint!("[{label}] {}", String::from_utf8_lossy(&line));
                            }
                            me.push(&line);
                        }
                    }
                }
            })
            .expect("spawning a stderr pump")
    }
}

/// Starts a thread that sends each stdout line (without its newline) to the
/// returned channel; the channel disconnects at EOF.
pub(crate) fn pump_lines(stdout: ChildStdout, label: String) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("{label}-stdout"))
        .spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            loop {
                line.clear();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        let l = line.strip_suffix('\n').unwrap_or(&line).to_string();
                        if tx.send(l).is_err() {
                            return;
                        }
                    }
                }
            }
        })
        .expect("spawning a stdout pump");
    rx
}

/// A spawn request for the spawner thread.
type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` with `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills the
/// child when its parent goes away.
///
/// Linux's "parent" for that signal is the *thread* that forked, not the
/// process: a child forked on a test body's thread (or a tokio blocking
/// thread that idles out) would be killed when that thread ends even though
/// the test still holds it. So every child is forked on one spawner thread
/// that lives as long as the process and never exits; the signal then
/// fires exactly when the test process dies.
pub fn spawn_dying_with_us(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("child-spawner".into())
            .spawn(move || {
                // Holds `tx` alive through SPAWNER, so `recv` never fails:
                // the thread runs until the process ends.
                while let Ok((mut cmd, reply)) = rx.recv() {
                    let _ = reply.send(spawn_with_pdeathsig(&mut cmd));
                }
            })
            .expect("spawning the child-spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply_tx))
        .expect("the child-spawner thread never exits");
    reply_rx.recv().expect("the child-spawner thread answers every request")
}

#[allow(unsafe_code)]
fn spawn_with_pdeathsig(cmd: &mut Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the hook runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: prctl and getppid are plain
    // system calls, and the hook allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl, in which
            // case no signal will come: do not exec an orphan.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the test process died while spawning"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// A child process that is killed (SIGKILL) and reaped when dropped, and
/// registered with the test's [`Scope`] until reaped.
pub struct ChildGuard {
    child: Child,
    pid: u32,
    exit: Option<ExitStatus>,
    scope: Option<Scope>,
}

impl ChildGuard {
    /// Spawns `cmd` so that it cannot outlive the test process: besides the
    /// kill on drop and the [`Scope`]'s kill on timeout, the child gets
    /// SIGKILL from the kernel when this process dies by any means (a
    /// harness or CI timeout killing the test binary, an abort), see
    /// [`spawn_dying_with_us`].
    pub fn spawn(cmd: Command) -> std::io::Result<ChildGuard> {
        let child = spawn_dying_with_us(cmd)?;
        let pid = child.id();
        let scope = scope::register_pid(pid);
        Ok(ChildGuard { child, pid, exit: None, scope })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    fn reaped(&mut self, status: ExitStatus) -> ExitStatus {
        self.exit = Some(status);
        if let Some(s) = &self.scope {
            s.unregister_pid(self.pid);
        }
        status
    }

    /// The exit status if the process has ended (reaping it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if let Some(s) = self.exit {
            return Some(s);
        }
        match self.child.try_wait() {
            Ok(Some(status)) => Some(self.reaped(status)),
            Ok(None) => None,
            Err(e) => panic!("waiting for pid {}: {e}", self.pid),
        }
    }

    /// Waits up to `timeout` for the process to end.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` unless the process was already reaped.
    pub fn signal(&mut self, signal: nix::sys::signal::Signal) {
        if self.exit.is_some() {
            return;
        }
        // Not reaped, so the pid is still ours (at worst a zombie).
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), signal)
            .unwrap_or_else(|e| panic!("kill({}, {signal}): {e}", self.pid));
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) -> ExitStatus {
        if let Some(s) = self.exit {
            return s;
        }
        let _ = self.child.kill();
        let status = self.child.wait().unwrap_or_else(|e| panic!("reaping pid {}: {e}", self.pid));
        self.reaped(status)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            if let Ok(status) = self.child.wait() {
                self.reaped(status);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELPER_ENV: &str = "MAGNETAR_TEST_PDEATHSIG_HELPER";

    /// The state letter of `pid` from /proc, or None once it is gone.
    fn state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    }

    fn sleeper() -> Command {
        let mut cmd = Command::new("sleep");
        cmd.arg("120").stdin(Stdio::null());
        cmd
    }

    /// Not a test of its own: the process that
    /// `a_child_dies_with_the_test_process` runs and kills. It spawns a
    /// child through the harness, prints its pid, and waits to be killed.
    #[test]
    #[ignore = "helper process of a_child_dies_with_the_test_process"]
    fn pdeathsig_helper() {
        assert!(std::env::var_os(HELPER_ENV).is_some(), "run only by a_child_dies_with_the_test_process");
        let child = ChildGuard::spawn(sleeper()).expect("spawning sleep");
        println!("CHILD {}", child.pid());
        std::thread::sleep(Duration::from_secs(120));
        drop(child);
    }

    /// Goal: a child the harness spawned does not outlive the test process
    /// when that process is killed outright (no Drop, no timeout path runs),
    /// as when a CI or harness timeout kills a hung test binary.
    #[test]
    fn a_child_dies_with_the_test_process() {
        let mut helper = Command::new(std::env::current_exe().expect("current_exe"))
            .args(["--ignored", "--exact", "process::tests::pdeathsig_helper", "--nocapture", "--test-threads=1"])
            .env(HELPER_ENV, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning the helper");
        let lines = pump_lines(helper.stdout.take().expect("piped stdout"), "helper".into());
        let deadline = Instant::now() + Duration::from_secs(30);
        let child_pid: u32 = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    // libtest may print "test NAME ... " before it on the line.
                    if let Some((_, pid)) = line.split_once("CHILD ") {
                        break pid.trim().parse().expect("a pid");
                    }
                }
                Err(e) => {
                    let _ = helper.kill();
                    let _ = helper.wait();
                    panic!("the helper printed no child pid: {e}");
                }
            }
        };
        assert!(matches!(state(child_pid), Some(s) if s != 'Z'), "the child {child_pid} is not running");
        helper.kill().expect("SIGKILL the helper");
        helper.wait().expect("reaping the helper");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match state(child_pid) {
                None | Some('Z') => break,
                Some(s) => {
                    if Instant::now() >= deadline {
                        // Do not leave it behind either way.
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(child_pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                        panic!("child {child_pid} outlived its killed parent (state {s})");
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// Goal: the death signal follows the process, not the thread that
    /// asked for the spawn: a child spawned from a thread that then ends
    /// keeps running until its guard drops.
    #[test]
    fn a_child_outlives_the_thread_that_spawned_it() {
        let guard = std::thread::spawn(|| ChildGuard::spawn(sleeper()).expect("spawning sleep"))
            .join()
            .expect("the spawning thread");
        let pid = guard.pid();
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            matches!(state(pid), Some(s) if s != 'Z'),
            "child {pid} died with its spawning thread: {:?}",
            state(pid)
        );
        let mut guard = guard;
        assert!(guard.try_wait().is_none(), "child {pid} exited");
        let status = guard.kill9();
        assert!(!status.success());
    }
}
