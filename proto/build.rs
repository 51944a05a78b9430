//! Compiles `kiln/v1/*.proto` with the vendored `protoc`, so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let protos = [
        "kiln/v1/job.proto",
        "kiln/v1/artifact.proto",
        "kiln/v1/log.proto",
        "kiln/v1/batch.proto",
    ];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_with_config(config, &protos[..], &["."][..])?;
    Ok(())
}
