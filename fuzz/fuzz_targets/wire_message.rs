//! libFuzzer target: see `magnetar_fuzz::wire_message` and fuzz/README.md.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| magnetar_fuzz::wire_message(data));
