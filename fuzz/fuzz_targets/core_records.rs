//! libFuzzer target: see `magnetar_fuzz::core_records` and fuzz/README.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| magnetar_fuzz::core_records(data));
