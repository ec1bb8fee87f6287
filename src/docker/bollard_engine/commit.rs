//! Committing a container's root filesystem changes as an image (`docker commit`), and removing
//! such images: how a `Full` snapshot keeps every change a sandbox made outside `/workspace`
//! (files added, changed and deleted, with modes, owners and symlinks: Docker's own layer diff,
//! deletions as whiteouts) and how a new container starts with them already in place.
//!
//! The committed image gets a config of its own: the labels given and the base image's
//! environment, so nothing the server put into the container's environment (its `HOME`, the
//! egress gateway's proxy settings) becomes part of the image. Docker appends every container
//! variable the config does not name, so those are named with an empty value. It merges the
//! container's labels the same way, and labels cannot be emptied out: the image also carries the
//! source sandbox's name, uid and spec hash (nothing secret), which the labels of any container
//! made from it replace. Volumes (`/workspace`) and tmpfs mounts (`/tmp`) are never part of it.

use std::collections::{BTreeMap, HashMap};

use bollard::models::ContainerConfig;
use bollard::query_parameters::{CommitContainerOptions, ListImagesOptions, RemoveImageOptions};

use super::{is_status, map_err, BollardEngine};
use crate::docker::{CommittedRootfs, EngineError, EngineResult, LabeledImage};

fn key(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(key, _)| key)
}

/// The environment of the committed image: the base image's, and every other variable of the
/// container emptied.
fn image_env(base: &[String], container: &[String]) -> Vec<String> {
    let mut env: Vec<String> = base.to_vec();
    for entry in container {
        if !env.iter().any(|known| key(known) == key(entry)) {
            env.push(format!("{}=", key(entry)));
        }
    }
    env
}

impl BollardEngine {
    pub(super) async fn commit(
        &self,
        container: &str,
        reference: &str,
        labels: &BTreeMap<String, String>,
        pause: bool,
    ) -> EngineResult<CommittedRootfs> {
        let what = format!("container {container}");
        let details = self
            .docker
            .inspect_container(container, None)
            .await
            .map_err(map_err("inspect", &what))?;
        let base_id = details.image.clone().unwrap_or_default();
        let base = self
            .docker
            .inspect_image(&base_id)
            .await
            .map_err(map_err("inspect", &format!("image {base_id}")))?;
        let base_env = base
            .config
            .as_ref()
            .and_then(|c| c.env.clone())
            .unwrap_or_default();
        let container_env = details
            .config
            .as_ref()
            .and_then(|c| c.env.clone())
            .unwrap_or_default();
        let (repo, tag) = reference.rsplit_once(':').unwrap_or((reference, "latest"));
        let options = CommitContainerOptions {
            container: Some(container.to_string()),
            repo: Some(repo.to_string()),
            tag: Some(tag.to_string()),
            comment: Some("agent-sandbox snapshot".to_string()),
            pause,
            ..Default::default()
        };
        let config = ContainerConfig {
            env: Some(image_env(&base_env, &container_env)),
            labels: Some(labels.clone().into_iter().collect::<HashMap<_, _>>()),
            ..Default::default()
        };
        let committed = self
            .docker
            .commit_container(options, config)
            .await
            .map_err(|e| match e {
                // Docker answers 404 for more than a missing container (a missing layer or
                // image config): its words say which.
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 404,
                    message,
                } => EngineError::Docker {
                    operation: format!("commit {what}"),
                    message,
                },
                other => map_err("commit", &what)(other),
            })?;
        let image = self
            .docker
            .inspect_image(&committed.id)
            .await
            .map_err(map_err("inspect", &format!("image {}", committed.id)))?;
        let layer_digest = image
            .root_fs
            .as_ref()
            .and_then(|r| r.layers.as_ref())
            .and_then(|layers| layers.last().cloned())
            .unwrap_or_default();
        let size = |s: Option<i64>| s.unwrap_or(0).max(0) as u64;
        Ok(CommittedRootfs {
            image_id: committed.id,
            layer_digest,
            layer_bytes: size(image.size).saturating_sub(size(base.size)),
        })
    }

    pub(super) async fn images_with_label(&self, key: &str) -> EngineResult<Vec<LabeledImage>> {
        let options = ListImagesOptions {
            all: false,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![key.to_string()],
            )])),
            ..Default::default()
        };
        let images = self
            .docker
            .list_images(Some(options))
            .await
            .map_err(map_err("list", "images"))?;
        Ok(images
            .into_iter()
            .map(|image| LabeledImage {
                id: image.id,
                tags: image
                    .repo_tags
                    .into_iter()
                    .filter(|tag| tag != "<none>:<none>")
                    .collect(),
                labels: image.labels.into_iter().collect(),
                created: image.created,
            })
            .collect())
    }

    pub(super) async fn delete_image(&self, reference: &str) -> EngineResult<()> {
        let options = RemoveImageOptions {
            force: false,
            noprune: false,
            ..Default::default()
        };
        match self
            .docker
            .remove_image(reference, Some(options), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) if is_status(&e, 409) => Err(EngineError::Conflict {
                what: format!("image {reference} (a container still uses it)"),
            }),
            Err(e) => Err(map_err("remove", &format!("image {reference}"))(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::image_env;

    #[test]
    fn the_container_env_never_reaches_the_image() {
        let base = vec!["PATH=/bin".to_string()];
        let container = vec![
            "PATH=/bin".to_string(),
            "HOME=/workspace".to_string(),
            "HTTP_PROXY=http://10.0.0.1:3128".to_string(),
        ];
        assert_eq!(
            image_env(&base, &container),
            ["PATH=/bin", "HOME=", "HTTP_PROXY="]
        );
    }
}
