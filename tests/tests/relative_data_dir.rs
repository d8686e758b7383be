//! Goal: README set-up command 1 works as written, with the default relative
//! data directory `./data`. Method: run `magnetar standalone` with its working
//! directory set to a fresh test directory and no `--data-dir`, wait for the
//! listening line, produce one message through the CLI, stop with SIGTERM, and
//! check the data landed under `<cwd>/data`.

use magnetar_tests::{magnetar_bin, run_cli, run_with_timeout, test_dir};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn default_relative_data_dir_works() {
    run_with_timeout(Duration::from_secs(120), || {
        let dir = test_dir("relative-data-dir");
        let mut child = Command::new(magnetar_bin())
            // --disk-refuse-pct 100: not a watermark test (see core/tests/watermarks.rs).
            .args([
                "standalone",
                "--listen",
                "127.0.0.1:0",
                "--http-listen",
                "127.0.0.1:0",
                "--shards",
                "2",
                "--no-pin",
                "--disk-refuse-pct",
                "100",
            ])
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn magnetar standalone");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read stdout");
        if !line.contains("listening on") {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            panic!("broker did not start: {line:?}\n{}", String::from_utf8_lossy(&out.stderr));
        }
        let addr = line.trim().rsplit(' ').next().expect("address").to_string();
        let run =
            run_cli(["produce", "relative-dir-topic", "--message", "hello", "--url", &addr], Duration::from_secs(30));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM)
            .expect("SIGTERM");
        let status = child.wait().expect("wait");
        run.assert_success();
        assert!(status.success(), "broker exit {status:?}");
        assert!(dir.path().join("data/magnetar.format").exists(), "no data under <cwd>/data");
        assert!(dir.path().join("data/shard-0/CLEAN").exists(), "no clean-shutdown marker");
    });
}
