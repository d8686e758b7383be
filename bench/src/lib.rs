//! The benchmark harness lands with issue #6.
