//! Crash-safe file replacement: write a temp file beside the target, fsync it, rename it over the
//! target, fsync the directory. A crash leaves either the old or the new content, never a mix.
//!
//! Temp files are hidden (`.<name>.tmp-<pid>-<counter>`) so that folder scans skip them, and
//! unique per process and per write so that concurrent writes never share one. Leftovers from a
//! crash are removed by [`remove_temp_files`] when the store opens. Nothing here knows what the
//! files mean.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The marker every temp file name carries; nothing else in the data directory uses it.
const TEMP_MARKER: &str = ".tmp-";

/// Atomically replaces `path` with `contents`, creating parent directories.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(
        ".{file_name}{TEMP_MARKER}{}-{unique}",
        std::process::id()
    ));
    let written = (|| {
        // create_new: a stale file of the same name (pid reuse after a crash) is never appended to.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Whether `name` is a temp file [`write_atomic`] may have left behind.
pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(TEMP_MARKER)
}

/// Removes temp files left by an interrupted [`write_atomic`] directly inside `dir`. Returns how
/// many were removed; a missing directory is not an error.
pub(crate) fn remove_temp_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
        if is_file
            && name.to_str().is_some_and(is_temp_name)
            && std::fs::remove_file(entry.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_content_and_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/a.yaml");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.yaml"]);
    }

    #[test]
    fn concurrent_writes_to_different_files_do_not_collide() {
        let dir = tempfile::tempdir().unwrap();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let path = dir.path().join(format!("f{i}.json"));
                std::thread::spawn(move || {
                    for round in 0..50 {
                        write_atomic(&path, format!("{i}-{round}").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for i in 0..8 {
            let text = std::fs::read_to_string(dir.path().join(format!("f{i}.json"))).unwrap();
            assert_eq!(text, format!("{i}-49"));
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 8);
    }

    #[test]
    fn leftovers_from_a_crash_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".a.json.tmp-123-4"), b"torn").unwrap();
        std::fs::write(dir.path().join("a.json"), b"{}").unwrap();
        std::fs::write(dir.path().join(".keep"), b"").unwrap();
        assert_eq!(remove_temp_files(dir.path()), 1);
        assert!(dir.path().join("a.json").exists());
        assert!(dir.path().join(".keep").exists());
    }
}
