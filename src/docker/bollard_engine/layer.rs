//! Moving a Full snapshot's root filesystem changes in and out of Docker as one layer tar: the
//! top layer of a committed image, taken from Docker's image export (`GET /images/{name}/get`),
//! and an image made again from a base image and such a layer (`POST /images/load`).
//!
//! The load sends a tarball holding only the new layer: its image config lists the base image's
//! layers and then the new one, and Docker skips every layer whose chain it already has, so the
//! base image's layers never travel (the base image must be on the host; callers pull it first).
//! Docker checks the layer's digest against the config as it loads. Nothing here decides what a
//! layer may contain: callers validate it before it reaches this module.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, Write};

use bollard::query_parameters::ImportImageOptions;
use bytes::Bytes;
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio_util::io::ReaderStream;

use super::{map_err, BollardEngine};
use crate::archive::ChannelReader;
use crate::docker::{EngineError, EngineResult};

/// Tar's block size.
const BLOCK: u64 = 512;
/// Bytes read from the layer file at a time.
const PIECE: usize = 256 * 1024;

fn docker_error(operation: &str, message: impl Into<String>) -> EngineError {
    EngineError::Docker {
        operation: operation.to_string(),
        message: message.into(),
    }
}

impl BollardEngine {
    pub(super) async fn export_top_layer(
        &self,
        reference: &str,
        digest: &str,
        out: File,
    ) -> EngineResult<(u64, File)> {
        let operation = format!("export of image {reference}");
        let (tx, reader) = ChannelReader::new(16);
        let wanted = digest.to_string();
        let finding = tokio::task::spawn_blocking(move || find_layer(reader, &wanted, out));
        let mut saved = self.docker.export_image(reference);
        while let Some(chunk) = saved.next().await {
            let chunk = chunk.map_err(|e| e.to_string());
            let failed = chunk.is_err();
            // The reader hangs up once it found the layer: the rest is not needed.
            if tx.send(chunk).await.is_err() || failed {
                break;
            }
        }
        drop(tx);
        let found = finding
            .await
            .map_err(|e| docker_error(&operation, e.to_string()))?
            .map_err(|e| docker_error(&operation, e.to_string()))?;
        found.ok_or_else(|| {
            docker_error(
                &operation,
                format!("the image holds no layer with digest {digest}"),
            )
        })
    }

    pub(super) async fn load_rootfs(
        &self,
        base: &str,
        layer: File,
        size: u64,
        digest: &str,
        reference: &str,
        labels: &BTreeMap<String, String>,
    ) -> EngineResult<String> {
        let operation = format!("load of image {reference}");
        let image = self
            .docker
            .inspect_image(base)
            .await
            .map_err(map_err("inspect", &format!("image {base}")))?;
        let mut diff_ids = image
            .root_fs
            .as_ref()
            .and_then(|r| r.layers.clone())
            .unwrap_or_default();
        diff_ids.push(digest.to_string());
        let mut config = serde_json::to_value(image.config.clone().unwrap_or_default())
            .map_err(|e| docker_error(&operation, e.to_string()))?;
        if let Some(object) = config.as_object_mut() {
            object.insert("Labels".into(), json!(labels));
        }
        let config = json!({
            // Now, not the base image's: garbage collection spares images younger than a moment.
            "created": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "architecture": image.architecture,
            "os": image.os,
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let head = load_head(&config, reference, diff_ids.len(), size)
            .map_err(|e| docker_error(&operation, e.to_string()))?;
        let tail = vec![0u8; padding(size) + 2 * BLOCK as usize];
        let content = ReaderStream::with_capacity(
            tokio::io::AsyncReadExt::take(tokio::fs::File::from_std(layer), size),
            PIECE,
        );
        let body = stream::once(async move { Ok::<_, io::Error>(Bytes::from(head)) })
            .chain(content)
            .chain(stream::once(async move { Ok(Bytes::from(tail)) }));
        let options = ImportImageOptions {
            quiet: true,
            ..Default::default()
        };
        let mut answers = self.docker.import_image_stream(options, body, None);
        while let Some(answer) = answers.next().await {
            let answer = answer.map_err(|e| docker_error(&operation, e.to_string()))?;
            if let Some(detail) = answer.error_detail.and_then(|d| d.message) {
                return Err(docker_error(&operation, detail));
            }
        }
        let loaded = self
            .docker
            .inspect_image(reference)
            .await
            .map_err(map_err("inspect", &format!("image {reference}")))?;
        let top = loaded
            .root_fs
            .and_then(|r| r.layers)
            .and_then(|layers| layers.last().cloned());
        if top.as_deref() != Some(digest) {
            return Err(docker_error(
                &operation,
                format!("the loaded image's top layer is {top:?}, not {digest}"),
            ));
        }
        Ok(loaded.id.unwrap_or_default())
    }
}

/// Reads Docker's image export from `input` and writes the layer tar whose sha256 is `digest`
/// to `out`, answering its size. Layers are `<id>/layer.tar` in Docker's own format and
/// `blobs/sha256/<hex>` in the OCI layout of newer daemons; every candidate is hashed, as the
/// export names layers by other ids. Blocking.
fn find_layer(input: impl Read, digest: &str, mut out: File) -> io::Result<Option<(u64, File)>> {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    let blob = format!("blobs/sha256/{hex}");
    let mut archive = tar::Archive::new(input);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path_bytes().into_owned();
        let candidate = entry.header().entry_type() == tar::EntryType::Regular
            && (path.ends_with(b"/layer.tar") || path == blob.as_bytes());
        if !candidate {
            continue;
        }
        out.set_len(0)?;
        out.rewind()?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; PIECE];
        let mut written = 0u64;
        loop {
            let n = entry.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            out.write_all(&buffer[..n])?;
            written += n as u64;
        }
        if hex::encode(hasher.finalize()) == hex {
            out.flush()?;
            out.rewind()?;
            return Ok(Some((written, out)));
        }
    }
    Ok(None)
}

/// The tar entries of a `docker load` tarball before its layer: the image config and
/// `manifest.json` (listing `layers` layer files, the base image's first, which Docker never
/// opens when it has them), then the header of `layer.tar` of `size` bytes.
fn load_head(config: &Value, reference: &str, layers: usize, size: u64) -> io::Result<Vec<u8>> {
    let config = serde_json::to_vec(config)?;
    let config_name = format!("{}.json", hex::encode(Sha256::digest(&config)));
    let mut paths: Vec<String> = (1..layers).map(|i| format!("base-{i}/layer.tar")).collect();
    paths.push("layer.tar".into());
    let manifest = serde_json::to_vec(&json!([{
        "Config": config_name,
        "RepoTags": [reference],
        "Layers": paths,
    }]))?;
    let mut head = Vec::new();
    for (name, data) in [
        (config_name.as_str(), &config),
        ("manifest.json", &manifest),
    ] {
        head.extend_from_slice(&header(name, data.len() as u64)?);
        head.extend_from_slice(data);
        head.resize(head.len() + padding(data.len() as u64), 0);
    }
    head.extend_from_slice(&header("layer.tar", size)?);
    Ok(head)
}

fn header(name: &str, size: u64) -> io::Result<Vec<u8>> {
    let mut header = tar::Header::new_ustar();
    header.set_path(name)?;
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_cksum();
    Ok(header.as_bytes().to_vec())
}

fn padding(size: u64) -> usize {
    (size.div_ceil(BLOCK) * BLOCK - size) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_tarball_lists_every_layer_and_holds_only_the_last() {
        let config = json!({"rootfs": {"diff_ids": ["a", "b", "c"]}});
        let mut tar = load_head(&config, "repo:tag", 3, 3).unwrap();
        tar.extend_from_slice(b"abc");
        tar.resize(tar.len() + padding(3) + 1024, 0);
        let mut archive = tar::Archive::new(&tar[..]);
        let mut names = Vec::new();
        let mut manifest = Value::Null;
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            if name == "manifest.json" {
                manifest = serde_json::from_reader(&mut entry).unwrap();
            }
            names.push(name);
        }
        assert_eq!(names.len(), 3);
        assert_eq!(names[1..], ["manifest.json", "layer.tar"]);
        assert_eq!(
            manifest[0]["Layers"],
            json!(["base-1/layer.tar", "base-2/layer.tar", "layer.tar"])
        );
        assert_eq!(manifest[0]["Config"], json!(names[0]));
        assert_eq!(manifest[0]["RepoTags"], json!(["repo:tag"]));
    }

    #[test]
    fn the_layer_is_found_by_its_digest() {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, data) in [("1/layer.tar", &b"one"[..]), ("2/layer.tar", &b"two"[..])] {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_cksum();
            builder.append_data(&mut header, name, data).unwrap();
        }
        let export = builder.into_inner().unwrap();
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(b"one")));
        let out = tempfile_in_target();
        let (size, mut file) = find_layer(&export[..], &digest, out).unwrap().unwrap();
        let mut content = String::new();
        file.read_to_string(&mut content).unwrap();
        assert_eq!((size, content.as_str()), (3, "one"));
        let missing = format!("sha256:{}", "0".repeat(64));
        assert!(find_layer(&export[..], &missing, tempfile_in_target())
            .unwrap()
            .is_none());
    }

    fn tempfile_in_target() -> File {
        let path = std::env::temp_dir().join(format!(
            "layer-test-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }
}
