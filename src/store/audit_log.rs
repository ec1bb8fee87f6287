//! The audit trail's files: `audit/audit.jsonl` in the data directory, one JSON object per
//! line, appended whole with one `write` each (`O_APPEND`), so a killed server leaves whole
//! lines; `fsync` runs in batches, at most every [`SYNC_EVERY`], from a thread of its own, so a
//! power cut loses at most that much. When the file passes the size limit it becomes
//! `audit.jsonl.1` (older ones shift up to [`KEPT_GENERATIONS`]) and a new file starts. A torn
//! last line (a crash of the machine mid-write) is cut off when the log is opened.
//!
//! It stores lines; what a line says is [`crate::audit`]'s. It only needs each line's `time`
//! (RFC 3339) to answer [`AuditLog::read_since`].

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How often written lines are made durable.
pub const SYNC_EVERY: Duration = Duration::from_millis(200);
/// Rotated files kept besides the current one.
pub const KEPT_GENERATIONS: u32 = 4;
/// Most lines one read answers (the newest).
pub const MAX_READ_LINES: usize = 10_000;

const FILE: &str = "audit.jsonl";

pub struct AuditLog {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    max_bytes: u64,
    file: Mutex<Option<File>>,
    dirty: AtomicBool,
}

impl AuditLog {
    /// Opens (creating) the audit directory `dir`; files rotate past `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> AuditLog {
        if let Err(error) = fs::create_dir_all(dir) {
            tracing::warn!(%error, "cannot create the audit directory");
        }
        let current = dir.join(FILE);
        if let Err(error) = cut_torn_tail(&current) {
            tracing::warn!(%error, "cannot check the audit log's last line");
        }
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            max_bytes: max_bytes.max(4096),
            file: Mutex::new(open_append(&current)),
            dirty: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&inner);
        let _ = std::thread::Builder::new()
            .name("audit-sync".into())
            .spawn(move || sync_loop(weak));
        AuditLog { inner }
    }

    /// Appends one line (a JSON object, without its newline).
    pub fn append(&self, line: &str) {
        let inner = &self.inner;
        let mut file = inner.file.lock().unwrap_or_else(|e| e.into_inner());
        let current = inner.dir.join(FILE);
        if fs::metadata(&current).is_ok_and(|m| m.len() >= inner.max_bytes) {
            if let Some(f) = file.as_ref() {
                let _ = f.sync_data();
            }
            rotate(&inner.dir);
            *file = open_append(&current);
        }
        if file.is_none() {
            *file = open_append(&current);
        }
        let mut record = String::with_capacity(line.len() + 1);
        record.push_str(line);
        record.push('\n');
        match file.as_mut().map(|f| f.write_all(record.as_bytes())) {
            Some(Ok(())) => inner.dirty.store(true, Ordering::Release),
            Some(Err(error)) => tracing::warn!(%error, "cannot append to the audit log"),
            None => tracing::warn!("cannot open the audit log"),
        }
    }

    /// Makes every line written so far durable.
    pub fn sync(&self) {
        self.inner.sync();
    }

    /// The lines whose `time` is at or after `since` (all with `None`), oldest first, at most
    /// [`MAX_READ_LINES`] (the newest). Lines that are not JSON objects with a `time` are skipped.
    pub fn read_since(
        &self,
        since: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Vec<serde_json::Value> {
        let _writer = self.inner.file.lock().unwrap_or_else(|e| e.into_inner());
        let mut lines = Vec::new();
        for generation in (0..=KEPT_GENERATIONS).rev() {
            let Ok(text) = fs::read_to_string(generation_path(&self.inner.dir, generation)) else {
                continue;
            };
            for line in text.lines() {
                let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
                    continue;
                };
                let Some(time) = value
                    .get("time")
                    .and_then(|t| t.as_str())
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                else {
                    continue;
                };
                if since.is_none_or(|s| time >= s) {
                    lines.push(value);
                }
            }
        }
        let extra = lines.len().saturating_sub(MAX_READ_LINES);
        lines.drain(..extra);
        lines
    }
}

impl Drop for AuditLog {
    fn drop(&mut self) {
        self.inner.sync();
    }
}

impl Inner {
    fn sync(&self) {
        if self.dirty.swap(false, Ordering::AcqRel) {
            let file = self.file.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(Err(error)) = file.as_ref().map(|f| f.sync_data()) {
                tracing::warn!(%error, "cannot sync the audit log");
            }
        }
    }
}

fn sync_loop(inner: Weak<Inner>) {
    loop {
        std::thread::sleep(SYNC_EVERY);
        match inner.upgrade() {
            Some(inner) => inner.sync(),
            None => return,
        }
    }
}

fn generation_path(dir: &Path, generation: u32) -> PathBuf {
    if generation == 0 {
        dir.join(FILE)
    } else {
        dir.join(format!("{FILE}.{generation}"))
    }
}

fn open_append(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|error| tracing::warn!(%error, "cannot open the audit log"))
        .ok()
}

/// Shifts `audit.jsonl.N` up by one (dropping the oldest) and the current file to `.1`.
fn rotate(dir: &Path) {
    for generation in (0..KEPT_GENERATIONS).rev() {
        let from = generation_path(dir, generation);
        if from.exists() {
            if let Err(error) = fs::rename(&from, generation_path(dir, generation + 1)) {
                tracing::warn!(%error, "cannot rotate the audit log");
            }
        }
    }
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Cuts a last line that has no newline (torn by a crash of the machine).
fn cut_torn_tail(path: &Path) -> std::io::Result<()> {
    let mut file = match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    // Look back in blocks for the last newline.
    let mut end = len;
    let mut block = vec![0u8; 4096];
    while end > 0 {
        let start = end.saturating_sub(block.len() as u64);
        let n = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut block[..n])?;
        if let Some(i) = block[..n].iter().rposition(|b| *b == b'\n') {
            let keep = start + i as u64 + 1;
            if keep < len {
                file.set_len(keep)?;
                file.sync_all()?;
            }
            return Ok(());
        }
        end = start;
    }
    file.set_len(0)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(i: usize) -> String {
        format!(
            r#"{{"time":"2026-01-01T00:00:{:02}Z","key":"k","n":{i}}}"#,
            i % 60
        )
    }

    #[test]
    fn appends_reads_since_and_rotates_by_size() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(dir.path(), 4096);
        for i in 0..200 {
            log.append(&line(i));
        }
        log.sync();
        assert!(dir.path().join("audit.jsonl.1").exists(), "no rotation");
        assert!(!dir.path().join("audit.jsonl.6").exists());
        let all = log.read_since(None);
        assert_eq!(all.last().unwrap()["n"], 199);
        // Newest kept, in order, nothing torn.
        let ns: Vec<u64> = all.iter().map(|v| v["n"].as_u64().unwrap()).collect();
        assert!(ns.windows(2).all(|w| w[0] + 1 == w[1]), "{ns:?}");
        let since = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:50Z")
            .unwrap()
            .to_utc();
        assert!(log
            .read_since(Some(since))
            .iter()
            .all(|v| v["time"].as_str().unwrap() >= "2026-01-01T00:00:50Z"));
    }

    #[test]
    fn a_torn_last_line_is_cut_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        fs::write(&path, format!("{}\n{}\n{{\"time\":\"20", line(1), line(2))).unwrap();
        let log = AuditLog::open(dir.path(), 1 << 20);
        log.append(&line(3));
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("{}\n{}\n{}\n", line(1), line(2), line(3)));
        assert_eq!(log.read_since(None).len(), 3);
    }
}
