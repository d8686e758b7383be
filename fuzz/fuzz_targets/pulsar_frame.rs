//! libFuzzer target: see `magnetar_fuzz::pulsar_frame` and fuzz/README.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| magnetar_fuzz::pulsar_frame(data));
