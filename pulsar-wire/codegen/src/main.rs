//! Generates `pulsar-wire/src/generated/pulsar.proto.rs` from Apache
//! Pulsar's `PulsarApi.proto` with prost-build, parsing the schema with
//! protox (pure Rust), so regenerating needs no `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let proto_dir = crate_dir.join("proto");
    let out_dir = crate_dir.join("src").join("generated");
    let fds = protox::compile([proto_dir.join("PulsarApi.proto")], [&proto_dir])?;
    prost_build::Config::new().out_dir(&out_dir).compile_fds(fds)?;
    println!("generated {}", out_dir.join("pulsar.proto.rs").display());
    Ok(())
}
