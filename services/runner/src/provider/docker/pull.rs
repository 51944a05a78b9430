//! Images: pulled with the job's project's registry credentials (`kiln secret set --registry`),
//! and never handed to another project from the engine's cache.
//!
//! An image pulled with a project's credentials is private: the provider tags it
//! `kiln-grant-<project>:<image id>` on the engine, which every runner sharing the engine sees
//! and which outlives a runner's restart. A job finds a local image only when the image has no
//! grant tag (public, or built on the engine) or one of its own project's. Any other job pulls
//! the image again with its own project's credentials (or none): the registry decides, and a
//! refusal ends the job with the registry's reason. A locally built image identical to a private
//! one (the same image id) counts as private.

use std::time::Duration;

use bollard::auth::DockerCredentials;
use bollard::query_parameters::{CreateImageOptionsBuilder, TagImageOptionsBuilder};
use futures::StreamExt;

use super::DockerProvider;
use crate::error::{Error, Result};
use crate::provider::PullAuth;

/// The repository of a project's grant tags.
const GRANT_REPOSITORY: &str = "kiln-grant-";

/// The grant tag of `project` on an image (`kiln-grant-<project>:<id>`): repository names are
/// lowercase, so the project's name is hex-encoded when it is not.
pub(super) fn grant_tag(project: &str, image_id: &str) -> (String, String) {
    let safe = project
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    let name = if safe && !project.is_empty() {
        project.to_string()
    } else {
        format!("x{}", hex::encode(project))
    };
    let id = image_id.trim_start_matches("sha256:");
    (format!("{GRANT_REPOSITORY}{name}"), id[..id.len().min(64)].to_string())
}

/// Whether a registry's answer is a refusal of the credentials (or of their absence).
fn refused(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "unauthorized",
        "authentication required",
        "denied",
        "no basic auth credentials",
        "401",
        "403",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

impl DockerProvider {
    /// Makes the image available to a job of `project`: the engine's copy when it is public or
    /// granted to the project, else a pull with the project's credentials (`auth`).
    pub(super) async fn ensure_image(&self, image: &str, project: &str, auth: Option<&PullAuth>) -> Result<()> {
        if let Ok(local) = self.docker.inspect_image(image).await {
            let tags = local.repo_tags.unwrap_or_default();
            let private = tags.iter().any(|tag| tag.starts_with(GRANT_REPOSITORY));
            let (repository, tag) = grant_tag(project, local.id.as_deref().unwrap_or_default());
            if !private || tags.contains(&format!("{repository}:{tag}")) {
                return Ok(());
            }
            tracing::info!(
                image,
                project,
                "image is private to other projects; pulling it with this project's credentials"
            );
            return self.pull(image, project, auth, true).await;
        }
        self.pull(image, project, auth, false).await
    }

    /// Pulls the image; `private_elsewhere`: the engine holds it for other projects only.
    async fn pull(&self, image: &str, project: &str, auth: Option<&PullAuth>, private_elsewhere: bool) -> Result<()> {
        tracing::info!(image, registry = auth.map(|a| a.registry.as_str()), "pulling image");
        let options = CreateImageOptionsBuilder::new().from_image(image).build();
        let credentials = auth.map(|auth| DockerCredentials {
            username: Some(auth.credentials.username.clone()),
            password: Some(auth.credentials.password.clone()),
            serveraddress: Some(auth.registry.clone()),
            ..Default::default()
        });
        let pull = async {
            let mut progress = self.docker.create_image(Some(options), None, credentials);
            while let Some(step) = progress.next().await {
                let step = step.map_err(|e| e.to_string())?;
                if let Some(error) = step.error_detail.and_then(|detail| detail.message) {
                    return Err(error);
                }
            }
            Ok::<(), String>(())
        };
        let limit = Duration::from_secs(self.config.pull_timeout_secs);
        let failure = match tokio::time::timeout(limit, pull).await {
            Ok(Ok(())) => match self.docker.inspect_image(image).await {
                Ok(pulled) => {
                    if auth.is_some() {
                        self.grant(image, project, pulled.id.as_deref().unwrap_or_default())
                            .await?;
                    }
                    return Ok(());
                }
                Err(_) => "the pull ended without the image".to_string(),
            },
            Ok(Err(message)) => message,
            Err(_) => format!("the pull took longer than {}s", limit.as_secs()),
        };
        let registry = kiln_core::secrets::image_registry(image);
        let set = format!("`kiln secret set --registry {registry} --username USER --project {project}`");
        let why = match auth {
            Some(auth) if refused(&failure) => Some(format!(
                "registry {registry} refused project {project}'s credentials (user {}): {failure}; set them again with {set}",
                auth.credentials.username
            )),
            Some(_) => None,
            None if private_elsewhere => Some(format!(
                "the engine holds it for other projects only, and project {project} has no credentials for registry {registry} (a pull without them failed: {failure}); a maintainer sets them with {set}"
            )),
            None if refused(&failure) => Some(format!(
                "registry {registry} refused a pull without credentials (the image does not exist, or it is private and project {project} has no credentials for {registry}): {failure}; a maintainer sets them with {set}"
            )),
            None => None,
        };
        if let Some(why) = why {
            return Err(Error::ImageRefused {
                image: image.to_string(),
                why,
            });
        }
        Err(Error::ImageNotFound {
            image: image.to_string(),
            message: failure,
        })
    }

    /// Tags a pulled image as granted to `project`.
    async fn grant(&self, image: &str, project: &str, image_id: &str) -> Result<()> {
        let (repository, tag) = grant_tag(project, image_id);
        let options = TagImageOptionsBuilder::new().repo(&repository).tag(&tag).build();
        self.docker
            .tag_image(image, Some(options))
            .await
            .map_err(super::docker_error("tag a private image with its project's grant"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_tags_are_valid_references() {
        assert_eq!(
            grant_tag("vision", "sha256:abc123"),
            ("kiln-grant-vision".to_string(), "abc123".to_string())
        );
        let (repository, _) = grant_tag("Team.A", "sha256:ab");
        assert_eq!(repository, format!("kiln-grant-x{}", hex::encode("Team.A")));
    }

    #[test]
    fn refusals_are_told_from_other_failures() {
        assert!(refused(
            "Head \"https://127.0.0.1:5000/v2/x/manifests/1\": no basic auth credentials"
        ));
        assert!(refused("unauthorized: authentication required"));
        assert!(refused(
            "pull access denied for x, repository does not exist or may require 'docker login'"
        ));
        assert!(!refused("manifest for x:1 not found: manifest unknown"));
    }
}
