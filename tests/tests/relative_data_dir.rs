//! Goal: README set-up command 1 works as written, with the default relative
//! data directory `./data`. Method: run `magnetar standalone` with its working
//! directory set to a fresh test directory and no `--data-dir`, wait for the
//! listening line, produce one message through the CLI, stop with SIGTERM, and
//! check the data landed under `<cwd>/data`.

use magnetar_tests::{magnetar_bin, run_cli, run_with_timeout, test_dir, ChildGuard};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn default_relative_data_dir_works() {
    run_with_timeout(Duration::from_secs(120), || {
        let dir = test_dir("relative-data-dir");
        let mut cmd = Command::new(magnetar_bin());
        // --disk-refuse-pct 100: not a watermark test (see core/tests/watermarks.rs).
        cmd.args(["standalone", "--listen", "127.0.0.1:0", "--shards", "2", "--no-pin", "--disk-refuse-pct", "100"])
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // Through the harness, so it dies with the test whatever happens.
        let mut guard = ChildGuard::spawn(cmd).expect("spawn magnetar standalone");
        let stdout = guard.child_mut().stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read stdout");
        if !line.contains("listening on") {
            guard.kill9();
            let mut err = String::new();
            let _ = guard.child_mut().stderr.take().expect("stderr").read_to_string(&mut err);
            panic!("broker did not start: {line:?}\n{err}");
        }
        let addr = line.trim().rsplit(' ').next().expect("address").to_string();
        let run =
            run_cli(["produce", "relative-dir-topic", "--message", "hello", "--url", &addr], Duration::from_secs(30));
        guard.signal(nix::sys::signal::Signal::SIGTERM);
        let status = guard.wait_timeout(Duration::from_secs(60)).expect("the broker exits on SIGTERM");
        run.assert_success();
        assert!(status.success(), "broker exit {status:?}");
        assert!(dir.path().join("data/magnetar.format").exists(), "no data under <cwd>/data");
        assert!(dir.path().join("data/shard-0/CLEAN").exists(), "no clean-shutdown marker");
    });
}
