//! Test bodies with a deadline, and cleanup that happens even when a body
//! hangs.
//!
//! A test body runs on its own thread with a [`Scope`] installed in a
//! thread-local. Every broker or CLI process the harness spawns from that
//! thread registers its pid there, and every data directory made with
//! [`crate::test_dir`] registers its path. When the body finishes (or panics),
//! the usual `Drop` guards kill and reap the processes and delete the
//! directories. When the body is still running at the deadline, its thread
//! cannot be stopped, so the waiting thread kills the registered processes
//! with SIGKILL and deletes the directories itself before failing the test.
//!
//! A registered pid always belongs to a child that has not been reaped yet
//! (processes unregister right after `wait`), so it cannot have been reused by
//! an unrelated process when the timeout path kills it.

use std::cell::RefCell;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct ScopeInner {
    pids: Mutex<HashSet<u32>>,
    dirs: Mutex<Vec<PathBuf>>,
}

/// What a test body spawned, for cleanup on timeout. Cheap to clone.
#[derive(Clone, Default)]
pub struct Scope(Arc<ScopeInner>);

thread_local! {
    static CURRENT: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking test thread may poison the lock; the data is still valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Scope {
    /// The scope of the calling thread, if it runs a [`run_with_timeout`] body.
    pub fn current() -> Option<Scope> {
        CURRENT.with(|c| c.borrow().clone())
    }

    /// Installs this scope on the calling thread (for helper threads that
    /// spawn processes on behalf of a test body).
    pub fn enter(&self) {
        CURRENT.with(|c| *c.borrow_mut() = Some(self.clone()));
    }

    fn kill_all(&self) {
        let pids: Vec<u32> = lock(&self.0.pids).iter().copied().collect();
        for pid in pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        }
        for dir in lock(&self.0.dirs).drain(..) {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Registers a freshly spawned child with the calling thread's scope; the
/// returned scope (kept by the process guard) unregisters it after reaping,
/// whichever thread does that.
pub(crate) fn register_pid(pid: u32) -> Option<Scope> {
    let s = Scope::current()?;
    lock(&s.0.pids).insert(pid);
    Some(s)
}

/// Registers a directory to delete if the body times out.
pub(crate) fn register_dir(path: PathBuf) -> Option<Scope> {
    let s = Scope::current()?;
    lock(&s.0.dirs).push(path);
    Some(s)
}

impl Scope {
    /// Call right after the child was reaped (its pid may be reused from then on).
    pub(crate) fn unregister_pid(&self, pid: u32) {
        lock(&self.0.pids).remove(&pid);
    }

    pub(crate) fn unregister_dir(&self, path: &std::path::Path) {
        lock(&self.0.dirs).retain(|p| p != path);
    }
}

/// Runs `body` on a new thread and fails the test if it has not finished
/// within `timeout`. A panic in the body fails the test with the body's own
/// panic (re-raised here). On timeout, every process and directory the body
/// registered is killed or deleted first.
pub fn run_with_timeout<F>(timeout: Duration, body: F)
where
    F: FnOnce() + Send + 'static,
{
    let scope = Scope::default();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let body_scope = scope.clone();
    let name = std::thread::current().name().unwrap_or("test").to_string();
    let handle = std::thread::Builder::new()
        .name(format!("{name}-body"))
        .spawn(move || {
            body_scope.enter();
            // Dropped on return and on unwind alike, so the waiter wakes in both cases.
            let _done = done_tx;
            body();
        })
        .expect("spawning the test body thread");
    match done_rx.recv_timeout(timeout) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = handle.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            scope.kill_all();
            panic!("test {name} timed out after {timeout:?}; its broker and CLI processes were killed");
        }
    }
}

/// [`run_with_timeout`] for an async body: it runs on a current-thread tokio
/// runtime on the body thread (so processes it spawns land in the scope).
pub fn run_async_with_timeout<F, Fut>(timeout: Duration, body: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    run_with_timeout(timeout, move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("building a tokio runtime");
        rt.block_on(body());
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::ChildGuard;
    use std::sync::mpsc;

    fn state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) S ...": the state follows the last ')'.
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    }

    #[test]
    fn a_timed_out_body_has_its_processes_killed() {
        let (pid_tx, pid_rx) = mpsc::channel();
        let result = std::panic::catch_unwind(|| {
            run_with_timeout(Duration::from_millis(500), move || {
                let child = {
                    let mut cmd = std::process::Command::new("sleep");
                    cmd.arg("60");
                    ChildGuard::spawn(cmd).unwrap()
                };
                pid_tx.send(child.pid()).unwrap();
                // Hang, holding the child: only the timeout path can end it.
                std::thread::sleep(Duration::from_secs(60));
                drop(child);
            });
        });
        assert!(result.is_err(), "the body should have timed out");
        let pid = pid_rx.recv().unwrap();
        // Killed but not reaped (the hung body still owns the Child): a zombie.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while state(pid) != Some('Z') {
            assert!(std::time::Instant::now() < deadline, "pid {pid} is in state {:?}", state(pid));
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_finished_body_returns_and_a_panicking_one_fails() {
        run_with_timeout(Duration::from_secs(5), || {});
        let r = std::panic::catch_unwind(|| run_with_timeout(Duration::from_secs(5), || panic!("boom")));
        let msg = r.unwrap_err();
        assert_eq!(msg.downcast_ref::<&str>(), Some(&"boom"));
    }
}
