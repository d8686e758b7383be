//! CPU time of a process (all its threads), from `/proc/<pid>/task/*/schedstat`
//! (nanoseconds on CPU). CPU per message is a steadier figure than
//! throughput on a shared machine: waiting for a core inflates wall-clock
//! time, not CPU time.

/// Nanoseconds the threads of `pid` (now alive) have run; `None` off Linux
/// or when the process is gone.
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    for task in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else { continue };
        if let Some(ns) = text.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()) {
            total += ns;
        }
    }
    Some(total)
}

/// CPU used by this process and, if known, the broker's, over a run.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct CpuUse {
    pub client_cpu_s: f64,
    /// `None` for an external broker (its pid is unknown).
    pub broker_cpu_s: Option<f64>,
    /// Messages the figures are divided by (receipts; each was also consumed
    /// by every subscription).
    pub messages: u64,
    pub client_us_per_msg: f64,
    pub broker_us_per_msg: Option<f64>,
}

/// A start mark; [`CpuMark::finish`] gives the use since.
pub struct CpuMark {
    client: u64,
    broker: Option<(u32, u64)>,
}

impl CpuMark {
    pub fn start(broker_pid: Option<u32>) -> CpuMark {
        CpuMark {
            client: process_cpu_ns(std::process::id()).unwrap_or(0),
            broker: broker_pid.and_then(|pid| process_cpu_ns(pid).map(|ns| (pid, ns))),
        }
    }

    pub fn finish(&self, messages: u64) -> CpuUse {
        let client = process_cpu_ns(std::process::id()).unwrap_or(0).saturating_sub(self.client) as f64 / 1e9;
        let broker =
            self.broker.and_then(|(pid, ns)| process_cpu_ns(pid).map(|now| now.saturating_sub(ns) as f64 / 1e9));
        let per = |s: f64| if messages > 0 { s * 1e6 / messages as f64 } else { 0.0 };
        CpuUse {
            client_cpu_s: client,
            broker_cpu_s: broker,
            messages,
            client_us_per_msg: per(client),
            broker_us_per_msg: broker.map(per),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_grows_with_work() {
        let mark = CpuMark::start(None);
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let used = mark.finish(1);
        assert!(used.client_cpu_s > 0.0, "{used:?}");
        assert!(used.broker_cpu_s.is_none());
    }
}
