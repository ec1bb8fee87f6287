//! The scoped keys of the keys file, kept current: read at start, re-read when its content
//! changes (checked every [`RELOAD_EVERY`]), with a revocation token per key that is cancelled
//! when the key leaves the file or its name, role or namespaces change, so that requests and
//! streams already admitted with it end. Also the edits `agent-sandbox keys create|revoke` make
//! (atomically: a temporary file renamed over the old one).
//!
//! A file that cannot be read or parsed at start is an error; later, a broken edit is logged
//! and the keys in force stay as they were, except that a removed file revokes every key.
//! Holds digests only: a key passes through [`new_key`] once, to be printed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::Principal;
use crate::resource::keyfile::{self, KeyEntry, KeyFileError, Role};

/// How often the file is looked at: a revoked key stops working within this (and a request's
/// own time).
pub const RELOAD_EVERY: Duration = Duration::from_millis(250);

#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error("cannot read the keys file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the keys file {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the keys file {}: {source}", path.display())]
    Invalid {
        path: PathBuf,
        #[source]
        source: KeyFileError,
    },
    #[error("the keys file {} has no key named {name:?}", path.display())]
    NoSuchKey { path: PathBuf, name: String },
    #[error("the keys file {} already has a key named {name:?}", path.display())]
    NameTaken { path: PathBuf, name: String },
    #[error("{0}")]
    BadArgument(String),
}

struct Entry {
    entry: KeyEntry,
    digest: [u8; 32],
    revoked: CancellationToken,
}

/// The keys of one keys file.
pub struct Keyring {
    path: PathBuf,
    state: RwLock<State>,
}

#[derive(Default)]
struct State {
    text: Option<String>,
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring({})", self.path.display())
    }
}

fn read_text(path: &Path) -> Result<Option<String>, KeyringError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(KeyringError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn parse_at(path: &Path, text: &str) -> Result<Vec<KeyEntry>, KeyringError> {
    keyfile::parse(text).map_err(|source| KeyringError::Invalid {
        path: path.to_path_buf(),
        source,
    })
}

fn decode(hex_digest: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    if let Ok(bytes) = hex::decode(hex_digest) {
        if bytes.len() == 32 {
            out.copy_from_slice(&bytes);
        }
    }
    out
}

impl Keyring {
    /// Loads `path` (a missing file is no keys yet).
    pub fn load(path: &Path) -> Result<Keyring, KeyringError> {
        let ring = Keyring {
            path: path.to_path_buf(),
            state: RwLock::new(State::default()),
        };
        let text = read_text(path)?;
        let entries = match &text {
            Some(t) => parse_at(path, t)?,
            None => Vec::new(),
        };
        ring.install(text, entries);
        Ok(ring)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The principal of the key whose SHA-256 is `digest`. Compares every entry in constant time.
    pub fn identify(&self, digest: &[u8; 32]) -> Option<Principal> {
        use subtle::ConstantTimeEq;
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        let mut found = None;
        for e in &state.entries {
            if bool::from(e.digest.ct_eq(digest)) {
                found = Some(Principal::scoped(
                    &e.entry.name,
                    e.entry.role,
                    &e.entry.namespaces,
                    e.revoked.clone(),
                ));
            }
        }
        found
    }

    /// Re-reads the file if its content changed. Returns whether anything changed.
    pub fn reload(&self) -> Result<bool, KeyringError> {
        let text = read_text(&self.path)?;
        {
            let state = self.state.read().unwrap_or_else(|e| e.into_inner());
            if state.text == text {
                return Ok(false);
            }
        }
        let entries = match &text {
            Some(t) => parse_at(&self.path, t)?,
            None => Vec::new(),
        };
        self.install(text, entries);
        Ok(true)
    }

    /// Puts `entries` in force: an entry identical to one in force keeps its token; every
    /// other entry in force is revoked.
    fn install(&self, text: Option<String>, entries: Vec<KeyEntry>) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        let mut old: HashMap<String, Entry> = state
            .entries
            .drain(..)
            .map(|e| (e.entry.name.clone(), e))
            .collect();
        let fresh = entries
            .into_iter()
            .map(|entry| match old.remove(&entry.name) {
                Some(kept) if kept.entry == entry => kept,
                other => {
                    if let Some(changed) = other {
                        changed.revoked.cancel();
                    }
                    Entry {
                        digest: decode(&entry.sha256),
                        entry,
                        revoked: CancellationToken::new(),
                    }
                }
            })
            .collect();
        for (name, gone) in old {
            tracing::info!(key = %name, "key revoked: it left the keys file or changed");
            gone.revoked.cancel();
        }
        state.entries = fresh;
        state.text = text;
    }

    /// Keeps the keys current until `stop`: re-reads every [`RELOAD_EVERY`], logging (once per
    /// distinct problem) a file that cannot be used.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let mut last_problem: Option<String> = None;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(RELOAD_EVERY) => {}
            }
            match self.reload() {
                Ok(changed) => {
                    if changed {
                        tracing::info!(path = %self.path.display(), "keys file reloaded");
                    }
                    last_problem = None;
                }
                Err(e) => {
                    let text = e.to_string();
                    if last_problem.as_ref() != Some(&text) {
                        tracing::error!(error = %text, "keys file not reloaded; the keys in force stay");
                        last_problem = Some(text);
                    }
                }
            }
        }
    }
}

/// The entries of the keys file at `path` (none when it does not exist).
pub fn list(path: &Path) -> Result<Vec<KeyEntry>, KeyringError> {
    match read_text(path)? {
        Some(text) => parse_at(path, &text),
        None => Ok(Vec::new()),
    }
}

/// A new random key (printed once by `keys create`, never stored).
pub fn new_key() -> String {
    format!("ask_{}", hex::encode(rand::random::<[u8; 32]>()))
}

/// Adds a key named `name` with `role` in `namespaces` to the file at `path`, returning the key.
pub fn create(
    path: &Path,
    name: &str,
    namespaces: &[String],
    role: Role,
) -> Result<String, KeyringError> {
    let mut entries = list(path)?;
    if entries.iter().any(|e| e.name == name) {
        return Err(KeyringError::NameTaken {
            path: path.to_path_buf(),
            name: name.to_string(),
        });
    }
    if !keyfile::valid_name(name) {
        return Err(KeyringError::BadArgument(format!(
            "--name {name:?}: must be 1-63 lowercase letters, digits or '-'"
        )));
    }
    if let Some(bad) = namespaces
        .iter()
        .find(|n| n.as_str() != "*" && !keyfile::valid_name(n))
    {
        return Err(KeyringError::BadArgument(format!(
            "--namespace {bad:?}: not a namespace name (or \"*\")"
        )));
    }
    if namespaces.is_empty() {
        return Err(KeyringError::BadArgument(
            "--namespace: name at least one namespace, or \"*\"".into(),
        ));
    }
    let key = new_key();
    entries.push(KeyEntry {
        name: name.to_string(),
        sha256: hex::encode(Sha256::digest(key.as_bytes())),
        namespaces: namespaces.to_vec(),
        role,
    });
    write(path, &entries)?;
    Ok(key)
}

/// Removes the key named `name` from the file at `path`.
pub fn revoke(path: &Path, name: &str) -> Result<(), KeyringError> {
    let mut entries = list(path)?;
    let before = entries.len();
    entries.retain(|e| e.name != name);
    if entries.len() == before {
        return Err(KeyringError::NoSuchKey {
            path: path.to_path_buf(),
            name: name.to_string(),
        });
    }
    write(path, &entries)
}

/// Writes the file atomically, readable by its owner only.
fn write(path: &Path, entries: &[KeyEntry]) -> Result<(), KeyringError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| KeyringError::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "keys".into());
    let tmp = dir
        .unwrap_or(Path::new("."))
        .join(format!(".{file_name}.{}.tmp", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    file.write_all(keyfile::render(entries).as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)?;
    if let Some(dir) = dir {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(key: &str) -> [u8; 32] {
        Sha256::digest(key.as_bytes()).into()
    }

    #[test]
    fn create_identify_revoke_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.yaml");
        let ring = Keyring::load(&path).unwrap();
        let key = create(&path, "ci", &["team-a".into()], Role::Edit).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&key), "the key itself is never stored");
        assert!(ring.identify(&digest(&key)).is_none());
        assert!(ring.reload().unwrap());
        let p = ring.identify(&digest(&key)).unwrap();
        assert_eq!((p.name(), p.role()), ("ci", Role::Edit));
        assert!(p.reaches("team-a") && !p.reaches("default"));
        let other = create(&path, "ops", &["*".into()], Role::Admin).unwrap();
        assert!(ring.reload().unwrap());
        assert!(!p.is_revoked(), "an unchanged key keeps working");
        revoke(&path, "ci").unwrap();
        assert!(ring.reload().unwrap());
        assert!(p.is_revoked());
        assert!(ring.identify(&digest(&key)).is_none());
        assert!(ring.identify(&digest(&other)).unwrap().reaches("any"));
        assert!(matches!(
            revoke(&path, "ci"),
            Err(KeyringError::NoSuchKey { .. })
        ));
        assert!(!ring.reload().unwrap());
    }

    #[test]
    fn a_broken_edit_keeps_the_keys_and_a_removed_file_revokes_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.yaml");
        let key = create(&path, "ci", &["default".into()], Role::View).unwrap();
        let ring = Keyring::load(&path).unwrap();
        let p = ring.identify(&digest(&key)).unwrap();
        std::fs::write(&path, "- name: [\n").unwrap();
        assert!(matches!(ring.reload(), Err(KeyringError::Invalid { .. })));
        assert!(!p.is_revoked());
        std::fs::remove_file(&path).unwrap();
        assert!(ring.reload().unwrap());
        assert!(p.is_revoked());
        std::fs::write(&path, "nonsense: true\n").unwrap();
        assert!(Keyring::load(&path).is_err());
    }
}
