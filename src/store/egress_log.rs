//! The egress decision logs: one NDJSON file per sandbox under `egress/` in the data directory,
//! appended to by the egress gateway and read by the API. Retention is bounded by size: when a
//! file passes [`EGRESS_LOG_BYTES`] it becomes the one older generation kept (`.1`) and a new
//! file starts, so a sandbox's log holds at most twice that. Lines are written whole, one `write`
//! each, so a crash loses at most the line being written; a torn last line is skipped on read.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Size at which a sandbox's log starts a new generation.
pub const EGRESS_LOG_BYTES: u64 = 1024 * 1024;

pub struct EgressLog {
    dir: PathBuf,
    /// Appends and rotations of all sandboxes, one at a time (they are short).
    writing: Mutex<()>,
}

impl EgressLog {
    pub(super) fn open(dir: &Path) -> EgressLog {
        if let Err(error) = fs::create_dir_all(dir) {
            tracing::warn!(%error, "cannot create the egress log directory");
        }
        EgressLog {
            dir: dir.to_path_buf(),
            writing: Mutex::new(()),
        }
    }

    /// The current file of `sandbox`, when the name is one a file may have.
    fn path(&self, sandbox: &str) -> Option<PathBuf> {
        let safe = !sandbox.is_empty()
            && !sandbox.starts_with('.')
            && sandbox
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_');
        safe.then(|| self.dir.join(format!("{sandbox}.ndjson")))
    }

    /// Appends one line (a JSON object, without its newline) to `sandbox`'s log.
    pub fn append(&self, sandbox: &str, line: &str) {
        let Some(path) = self.path(sandbox) else {
            return;
        };
        let _one_writer = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        if fs::metadata(&path).is_ok_and(|m| m.len() >= EGRESS_LOG_BYTES) {
            let older = path.with_extension("ndjson.1");
            if let Err(error) = fs::rename(&path, &older) {
                tracing::warn!(sandbox, %error, "cannot rotate the egress log");
            }
        }
        let mut record = String::with_capacity(line.len() + 1);
        record.push_str(line);
        record.push('\n');
        let written = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(record.as_bytes()));
        if let Err(error) = written {
            tracing::warn!(sandbox, %error, "cannot append to the egress log");
        }
    }

    /// Every kept line of `sandbox`'s log, oldest first.
    pub fn read(&self, sandbox: &str) -> Vec<String> {
        let Some(path) = self.path(sandbox) else {
            return Vec::new();
        };
        let _one_writer = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let mut lines = Vec::new();
        for file in [path.with_extension("ndjson.1"), path] {
            let Ok(text) = fs::read_to_string(&file) else {
                continue;
            };
            lines.extend(
                text.lines()
                    .filter(|line| serde_json::from_str::<serde_json::Value>(line).is_ok())
                    .map(str::to_string),
            );
        }
        lines
    }

    /// Forgets `sandbox`'s log (it was deleted; a new sandbox of that name starts afresh).
    pub fn remove(&self, sandbox: &str) {
        let Some(path) = self.path(sandbox) else {
            return;
        };
        let _one_writer = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let _ = fs::remove_file(path.with_extension("ndjson.1"));
        let _ = fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_kept_bounded_and_names_cannot_escape() {
        let dir = tempfile::tempdir().unwrap();
        let log = EgressLog::open(&dir.path().join("egress"));
        log.append("web", r#"{"n":1}"#);
        log.append("web", r#"{"n":2}"#);
        assert_eq!(log.read("web"), [r#"{"n":1}"#, r#"{"n":2}"#]);
        // A torn last line (a crash mid-write) is skipped.
        let path = dir.path().join("egress/web.ndjson");
        OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"n\":")
            .unwrap();
        assert_eq!(log.read("web").len(), 2);

        let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(1000));
        for _ in 0..3000 {
            log.append("busy", &big);
        }
        let kept: u64 = ["busy.ndjson", "busy.ndjson.1"]
            .iter()
            .map(|f| {
                fs::metadata(dir.path().join("egress").join(f))
                    .unwrap()
                    .len()
            })
            .sum();
        assert!(kept <= 2 * EGRESS_LOG_BYTES + 2048, "{kept}");
        assert!(log.read("busy").len() > 1000);

        for hostile in ["../x", "", ".hidden", "a/b"] {
            log.append(hostile, "{}");
            assert!(log.read(hostile).is_empty());
        }
        assert!(!dir.path().join("x.ndjson").exists());
        log.remove("web");
        assert!(log.read("web").is_empty());
    }
}
