//! Pulling an image: the daemon's `images/create` stream, summed over layers into one
//! `(bytes done, bytes total)`, its errors kept in the registry's words, and the registry
//! credentials of a Docker client config file (`auths`: `{"host": {"auth": base64(user:pass)}}`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bollard::auth::DockerCredentials;
use bollard::query_parameters::CreateImageOptions;
use futures::StreamExt;

use super::{server_message, BollardEngine, EngineError, EngineResult, PullProgress};

impl BollardEngine {
    pub(super) async fn pull(
        &self,
        image: &str,
        auth_file: Option<&Path>,
        progress: PullProgress,
    ) -> EngineResult<()> {
        let failed = |message: String| EngineError::PullFailed {
            image: image.to_string(),
            message,
        };
        let (name, tag) = split_reference(image);
        let options = CreateImageOptions {
            from_image: Some(name.to_string()),
            tag: Some(tag.to_string()),
            ..Default::default()
        };
        let credentials = credentials_for(registry_of(image), auth_file);
        let mut stream = self.docker.create_image(Some(options), None, credentials);
        // Per layer: (current, total) of its download.
        let mut layers: HashMap<String, (u64, u64)> = HashMap::new();
        while let Some(item) = stream.next().await {
            let info = match item {
                Ok(info) => info,
                Err(e) => {
                    let message = server_message(&e)
                        .map(str::to_string)
                        .unwrap_or_else(|| e.to_string());
                    return Err(failed(message));
                }
            };
            if let Some(detail) = info.error_detail {
                return Err(failed(detail.message.unwrap_or_default()));
            }
            let (Some(id), Some(status)) = (info.id, info.status) else {
                continue;
            };
            let entry = layers.entry(id).or_default();
            let detail = info.progress_detail.unwrap_or_default();
            let current = u64::try_from(detail.current.unwrap_or(0)).unwrap_or(0);
            let total = u64::try_from(detail.total.unwrap_or(0)).unwrap_or(0);
            match status.as_str() {
                "Downloading" => *entry = (current, total.max(entry.1)),
                "Download complete" | "Pull complete" | "Already exists" => {
                    entry.0 = entry.1;
                }
                _ => continue,
            }
            let done = layers.values().map(|l| l.0).sum();
            let total = layers.values().map(|l| l.1).sum();
            progress(done, total);
        }
        Ok(())
    }
}

/// `registry/name:tag` into `registry/name` and `tag` (`latest` when none; a digest stays whole).
fn split_reference(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => (&image[..last_slash + i], &image[last_slash + i + 1..]),
        None => (image, "latest"),
    }
}

/// The registry host an image reference names, or Docker Hub's.
fn registry_of(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            first
        }
        _ => "https://index.docker.io/v1/",
    }
}

/// The credentials `auth_file` (else the server user's Docker config) holds for `registry`.
fn credentials_for(registry: &str, auth_file: Option<&Path>) -> Option<DockerCredentials> {
    let path = match auth_file {
        Some(path) => path.to_path_buf(),
        None => std::env::var_os("DOCKER_CONFIG")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")))?
            .join("config.json"),
    };
    let text = std::fs::read_to_string(&path).ok()?;
    let config: serde_json::Value = serde_json::from_str(&text).ok()?;
    let auths = config.get("auths")?.as_object()?;
    let entry = auths.iter().find_map(|(host, entry)| {
        let bare = host
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .trim_end_matches('/');
        (host == registry || bare == registry).then_some(entry)
    })?;
    let decoded = decode_base64(entry.get("auth")?.as_str()?)?;
    let (username, password) = String::from_utf8(decoded)
        .ok()?
        .split_once(':')
        .map(|(u, p)| (u.to_string(), p.to_string()))?;
    Some(DockerCredentials {
        username: Some(username),
        password: Some(password),
        serveraddress: Some(registry.to_string()),
        ..Default::default()
    })
}

/// Standard base64 (padding optional).
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.trim().trim_end_matches('=').bytes() {
        acc = (acc << 6) | value(c)?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_name_and_tag() {
        assert_eq!(split_reference("busybox"), ("busybox", "latest"));
        assert_eq!(
            split_reference("127.0.0.1:5000/t/busybox:v1"),
            ("127.0.0.1:5000/t/busybox", "v1")
        );
        assert_eq!(
            split_reference("127.0.0.1:5000/busybox"),
            ("127.0.0.1:5000/busybox", "latest")
        );
        assert_eq!(registry_of("127.0.0.1:5000/t/b:1"), "127.0.0.1:5000");
        assert_eq!(registry_of("python:3.12"), "https://index.docker.io/v1/");
    }

    #[test]
    fn credentials_come_from_the_auths_of_a_client_config() {
        assert_eq!(decode_base64("dXNlcjpwYXNz").unwrap(), b"user:pass");
        assert_eq!(decode_base64("YQ==").unwrap(), b"a");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        std::fs::write(
            &file,
            r#"{"auths": {"https://reg.example:5000/": {"auth": "dXNlcjpwYXNz"}}}"#,
        )
        .unwrap();
        let found = credentials_for("reg.example:5000", Some(&file)).unwrap();
        assert_eq!(found.username.as_deref(), Some("user"));
        assert_eq!(found.password.as_deref(), Some("pass"));
        assert!(credentials_for("other:5000", Some(&file)).is_none());
    }
}
