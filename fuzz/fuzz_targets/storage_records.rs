//! libFuzzer target: see `magnetar_fuzz::storage_records` and fuzz/README.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| magnetar_fuzz::storage_records(data));
