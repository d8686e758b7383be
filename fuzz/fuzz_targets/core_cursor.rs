//! libFuzzer target: see `magnetar_fuzz::core_cursor` and fuzz/README.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| magnetar_fuzz::core_cursor(data));
