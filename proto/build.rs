//! Compiles `kiln/v1/*.proto`, and apart from them `inference/grpc_predict_v2.proto`, with the
//! vendored `protoc`, so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let protos = [
        "kiln/v1/job.proto",
        "kiln/v1/artifact.proto",
        "kiln/v1/log.proto",
        "kiln/v1/batch.proto",
        "kiln/v1/item_log.proto",
        "kiln/v1/tenancy.proto",
        "kiln/v1/sweep.proto",
        "kiln/v1/model.proto",
        "kiln/v1/serve.proto",
    ];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = out_dir.join("kiln_v1_descriptors.bin");
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(&protoc);
    config.file_descriptor_set_path(&descriptors);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_with_config(config, &protos[..], &["."][..])?;
    write_rpc_methods(&descriptors, &out_dir.join("rpc_methods.rs"))?;
    compile_inference(protoc)
}

/// Compiles the Open Inference Protocol's gRPC service (`inference.GRPCInferenceService`) on its
/// own, with no descriptor set: a foreign protocol the predictor serves, kept out of
/// `RPC_METHODS` and so out of kiln's access policy table.
fn compile_inference(protoc: std::path::PathBuf) -> Result<(), Box<dyn std::error::Error>> {
    let proto = "inference/grpc_predict_v2.proto";
    println!("cargo:rerun-if-changed={proto}");
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_with_config(config, &[proto][..], &["."][..])?;
    Ok(())
}

/// Writes `RPC_METHODS`, the path of every gRPC method (`/kiln.v1.JobService/SubmitJob`), read
/// from the descriptors protoc wrote: the metrics layer labels only these, so a caller cannot
/// grow a label set by calling made-up paths.
fn write_rpc_methods(descriptors: &std::path::Path, out: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    use prost::Message;
    let set = prost_types::FileDescriptorSet::decode(std::fs::read(descriptors)?.as_slice())?;
    let mut paths = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                paths.push(format!("/{}.{}/{}", file.package(), service.name(), method.name()));
            }
        }
    }
    paths.sort();
    let mut code =
        String::from("/// The path of every kiln/v1 gRPC method, sorted.\npub const RPC_METHODS: &[&str] = &[\n");
    for path in paths {
        code.push_str(&format!("    {path:?},\n"));
    }
    code.push_str("];\n");
    std::fs::write(out, code)?;
    Ok(())
}
