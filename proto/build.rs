//! Generates Rust from `proto/muster/v1/*.proto`: prost messages and tonic
//! clients and servers.
//!
//! `protoc` comes from the `protoc-bin-vendored` crate unless `PROTOC` is set,
//! so a fresh machine needs no system package.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: a build script is single-threaded; nothing else reads the
        // environment concurrently.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-env-changed=PROTOC");
    // No transport constructors: the agent RPC is named Connect, which would
    // clash with the generated `connect`; callers build channels themselves.
    // The descriptor set feeds gRPC server reflection (grpcurl and friends).
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    // Every client and server starts its streams with small buffers
    // (`src/codec.rs`): a leader holds one stream per node agent.
    tonic_prost_build::configure()
        .build_transport(false)
        .codec_path("crate::codec::SmallBufferCodec")
        .file_descriptor_set_path(out_dir.join("muster_descriptor.bin"))
        .compile_protos(
            &[
                "proto/muster/v1/types.proto",
                "proto/muster/v1/raft.proto",
                "proto/muster/v1/scheduler.proto",
                "proto/muster/v1/agent.proto",
                "proto/muster/v1/history.proto",
            ],
            &["proto"],
        )?;
    Ok(())
}
