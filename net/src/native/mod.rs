//! The native protocol's door: how its frames map onto the broker API.

pub(crate) mod admin;
