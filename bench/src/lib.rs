//! magnetar-bench: Magnetar's benchmark harness (issue #6).
//!
//! - [`workload`]: what a run does (defaults = the canonical workload, TOML
//!   file, flags) and the refusal of features the broker lacks yet.
//! - [`run`]: producers and consumers on the Rust client, open-loop rate
//!   control, progress.
//! - [`pulsar`]: the same run through the Pulsar door with the `pulsar`
//!   crate (`--protocol pulsar`).
//! - [`pace`]: the producers' shared rate, and the sustainable-rate search.
//! - [`stats`]: HDR histograms and the latency accounting (from the intended
//!   send time: no coordinated omission).
//! - [`report`]: the JSON result (a contract), history, summary, `--compare`.
//! - [`plot`]: the SVG picture.
//! - [`broker`]: a `magnetar standalone` the bench starts itself.
//! - [`cpu`]: CPU time of client and broker per message.
//! - [`dist`]: seeded size and key distributions (uniform, weighted, Zipf).
//!
//! See `README.md` for the flags, and `RESULTS.md` for the figures measured
//! with it.

pub mod broker;
pub mod cpu;
pub mod dist;
pub mod pace;
pub mod plot;
pub mod pulsar;
pub mod report;
pub mod run;
pub mod stats;
pub mod workload;
