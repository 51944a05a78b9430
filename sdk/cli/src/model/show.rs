//! Printing models and versions: tables and `-o json`.

use std::collections::BTreeMap;

use anyhow::Result;
use kiln_proto::v1 as pb;
use serde_json::json;
use tabled::settings::Style;

use super::VersionArg;
use crate::client::Clients;
use crate::format::{self, Output, bytes, out};

pub fn model_json(model: &pb::Model) -> serde_json::Value {
    json!({
        "name": model.name,
        "project": model.project,
        "latest_version": model.latest_version,
        "aliases": model.aliases.iter().collect::<BTreeMap<_, _>>(),
        "created_by": model.created_by,
        "created_at_ms": model.created_at_ms,
    })
}

fn config_json(value: &pb::ConfigValue) -> serde_json::Value {
    match kiln_core::runs::ConfigValue::from_proto(value) {
        Some(value) => serde_json::to_value(value).unwrap_or_default(),
        None => serde_json::Value::Null,
    }
}

pub fn version_json(version: &pb::ModelVersion) -> serde_json::Value {
    let lineage = version.lineage.clone().unwrap_or_default();
    let mut aliases = version.aliases.clone();
    aliases.sort();
    json!({
        "model": version.model,
        "project": version.project,
        "version": version.version,
        "digest": version.digest,
        "size": version.size,
        "description": version.description,
        "created_by": version.created_by,
        "created_at_ms": version.created_at_ms,
        "aliases": aliases,
        "tags": version.tags.iter().collect::<BTreeMap<_, _>>(),
        "files": version.files.iter().map(|f| json!({"path": f.path, "sha256": f.sha256, "size": f.size})).collect::<Vec<_>>(),
        "lineage": {
            "job_id": lineage.job_id,
            "sweep_id": lineage.sweep_id,
            "config": lineage.config.iter().map(|(k, v)| (k.clone(), config_json(v))).collect::<BTreeMap<_, _>>(),
            "metrics": lineage.metrics.iter().collect::<BTreeMap<_, _>>(),
            "image": lineage.image,
            "code_digest": lineage.code_digest,
            "datasets": lineage.datasets.iter().map(|d| json!({"name": d.name, "digest": d.digest})).collect::<Vec<_>>(),
            "job_owner": lineage.job_owner,
            "project": lineage.project,
            "source_path": lineage.source_path,
        },
    })
}

pub async fn show(clients: &mut Clients, version: VersionArg, project: &str, output: Output) -> Result<()> {
    let request = pb::GetModelVersionRequest {
        name: version.name,
        version: version.version,
        alias: version.alias,
        project: project.to_string(),
    };
    let version = clients.models.get_model_version(request).await?.into_inner();
    if output == Output::Json {
        return format::print_json(&version_json(&version));
    }
    let lineage = version.lineage.clone().unwrap_or_default();
    out!("{}:{}", version.model, version.version);
    out!("  project:     {}", version.project);
    out!("  digest:      {}", version.digest);
    out!(
        "  size:        {} in {} files",
        bytes(version.size),
        version.files.len()
    );
    if !version.description.is_empty() {
        out!("  description: {}", version.description);
    }
    out!(
        "  created:     {} ago by {}",
        format::age(version.created_at_ms),
        version.created_by
    );
    if !version.aliases.is_empty() {
        out!("  aliases:     {}", version.aliases.join(" "));
    }
    let tags: BTreeMap<_, _> = version.tags.iter().collect();
    if !tags.is_empty() {
        let tags: Vec<_> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out!("  tags:        {}", tags.join(" "));
    }
    out!("lineage:");
    out!(
        "  job:         {} (project {}, run by {})",
        lineage.job_id,
        lineage.project,
        lineage.job_owner
    );
    if !lineage.sweep_id.is_empty() {
        out!("  sweep:       {}", lineage.sweep_id);
    }
    out!(
        "  image:       {}",
        if lineage.image.is_empty() { "-" } else { &lineage.image }
    );
    out!(
        "  code:        {}",
        if lineage.code_digest.is_empty() {
            "-"
        } else {
            &lineage.code_digest
        }
    );
    for dataset in &lineage.datasets {
        out!("  dataset:     {} {}", dataset.name, dataset.digest);
    }
    let config: BTreeMap<_, _> = lineage.config.iter().collect();
    for (key, value) in config {
        let value = kiln_core::runs::ConfigValue::from_proto(value)
            .map(|v| v.to_string())
            .unwrap_or_default();
        out!("  config:      {key} = {value}");
    }
    let metrics: BTreeMap<_, _> = lineage.metrics.iter().collect();
    for (key, value) in metrics {
        out!("  metric:      {key} = {value}");
    }
    out!("files:");
    for file in &version.files {
        out!(
            "  {:>10}  {}  {}",
            bytes(file.size),
            &file.sha256[..12.min(file.sha256.len())],
            file.path
        );
    }
    Ok(())
}

pub fn print_versions(versions: &[pb::ModelVersion], output: Output) -> Result<()> {
    if output == Output::Json {
        let versions: Vec<_> = versions.iter().map(version_json).collect();
        return format::print_json(&versions);
    }
    let mut builder = tabled::builder::Builder::default();
    builder.push_record(["VERSION", "ALIASES", "TAGS", "JOB", "SIZE", "AGE", "DESCRIPTION"]);
    for version in versions {
        let mut tags: Vec<_> = version.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        tags.sort();
        let job = version.lineage.as_ref().map(|l| l.job_id.clone()).unwrap_or_default();
        builder.push_record([
            version.version.to_string(),
            version.aliases.join(" "),
            tags.join(" "),
            job,
            bytes(version.size),
            format::age(version.created_at_ms),
            version.description.clone(),
        ]);
    }
    out!("{}", builder.build().with(Style::blank()));
    Ok(())
}
