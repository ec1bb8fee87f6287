//! Crash-safe file replacement: write a temp file beside the target, fsync it, rename it over the
//! target, fsync the directory. A crash leaves either the old or the new content, never a mix.
//!
//! Temp files are hidden (`.<name>.tmp-<pid>-<counter>`) so that folder scans skip them, and
//! unique per process and per write so that concurrent writes never share one. Leftovers from a
//! crash are removed by [`remove_temp_files`] when the store opens. Nothing here knows what the
//! files mean.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The marker every temp file name carries; nothing else in the data directory uses it.
const TEMP_MARKER: &str = ".tmp-";

/// Atomically replaces `path` with `contents`, creating parent directories.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    write_all_atomic(&[(path, contents)])
}

/// [`write_atomic`] of several files at once: every temp file is written before any is synced,
/// and every rename made before any directory is synced, the syncs of each step all at once
/// ([`sync_all_at_once`]), so that the waits overlap (on ext4 the first sync commits everything
/// pending, and the others find only the disk's cache flush left to do). Each file ends up old
/// or new; after a crash during the call, which of them are new is not defined.
pub fn write_all_atomic(files: &[(&Path, &[u8])]) -> std::io::Result<()> {
    let mut temps = Vec::with_capacity(files.len());
    let mut files_written = Vec::with_capacity(files.len());
    let written = (|| {
        for (path, contents) in files {
            let (dir, tmp) = temp_beside(path)?;
            // create_new: a stale file of the same name (pid reuse after a crash) is never
            // appended to.
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            temps.push((dir, tmp, *path));
            file.write_all(contents)?;
            files_written.push(file);
        }
        sync_all_at_once(&files_written)
    })();
    if let Err(e) = written {
        for (_, tmp, _) in &temps {
            let _ = std::fs::remove_file(tmp);
        }
        return Err(e);
    }
    for (renamed, (_, tmp, path)) in temps.iter().enumerate() {
        if let Err(e) = std::fs::rename(tmp, path) {
            for (_, tmp, _) in &temps[renamed..] {
                let _ = std::fs::remove_file(tmp);
            }
            return Err(e);
        }
    }
    let mut dirs: Vec<&Path> = Vec::with_capacity(temps.len());
    for (dir, _, _) in &temps {
        if !dirs.contains(&dir.as_path()) {
            dirs.push(dir);
        }
    }
    let dirs = dirs
        .into_iter()
        .map(std::fs::File::open)
        .collect::<std::io::Result<Vec<_>>>()?;
    sync_all_at_once(&dirs)
}

/// The most threads one [`sync_all_at_once`] starts.
const MAX_SYNC_THREADS: usize = 32;

/// `fsync`s every one of `files`, all at once from threads of their own, not one after the
/// other: each `fsync` ends with a cache flush of the disk even when an earlier one's journal
/// commit already made its file durable, and flushes asked for at the same moment are merged
/// into one, where one after the other each waits for the disk (a batch of twenty files took
/// about 9 ms one by one on a virtual disk, in a trace that slowed every call).
fn sync_all_at_once(files: &[std::fs::File]) -> std::io::Result<()> {
    let Some((first, rest)) = files.split_first() else {
        return Ok(());
    };
    if rest.is_empty() {
        return first.sync_all();
    }
    let per_thread = rest.len().div_ceil(MAX_SYNC_THREADS);
    std::thread::scope(|scope| {
        let sync_group = |group: &[std::fs::File]| group.iter().try_for_each(|f| f.sync_all());
        let mut inline = Ok(());
        let mut others = Vec::new();
        for group in rest.chunks(per_thread) {
            match std::thread::Builder::new().spawn_scoped(scope, move || sync_group(group)) {
                Ok(thread) => others.push(thread),
                // No thread to be had: this one does it, later.
                Err(_) => inline = inline.and(sync_group(group)),
            }
        }
        let mine = first.sync_all().and(inline);
        others
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("fsync panicked")))
            })
            .fold(mine, |all, one| all.and(one))
    })
}

/// The directory of `path` (made if missing) and a fresh temp file name in it.
fn temp_beside(path: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
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
    Ok((dir.to_path_buf(), tmp))
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
    fn a_batch_larger_than_the_sync_threads_lands_whole() {
        let dir = tempfile::tempdir().unwrap();
        // Over two directories, more files than threads: some threads sync several.
        let paths: Vec<_> = (0..MAX_SYNC_THREADS * 2 + 3)
            .map(|i| dir.path().join(format!("{}/f{i}", i % 2)))
            .collect();
        let contents: Vec<_> = (0..paths.len()).map(|i| format!("file {i}")).collect();
        let files: Vec<_> = paths
            .iter()
            .zip(&contents)
            .map(|(p, c)| (p.as_path(), c.as_bytes()))
            .collect();
        write_all_atomic(&files).unwrap();
        for (path, content) in paths.iter().zip(&contents) {
            assert_eq!(std::fs::read_to_string(path).unwrap(), *content);
        }
        for sub in ["0", "1"] {
            assert_eq!(
                remove_temp_files(&dir.path().join(sub)),
                0,
                "no temp file left"
            );
        }
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
    fn several_files_are_replaced_together_and_a_failure_leaves_no_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("one/a.yaml");
        let b = dir.path().join("two/b.json");
        write_all_atomic(&[(&a, b"a1"), (&b, b"b1")]).unwrap();
        write_all_atomic(&[(&a, b"a2"), (&b, b"b2")]).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), b"a2");
        assert_eq!(std::fs::read(&b).unwrap(), b"b2");
        for sub in ["one", "two"] {
            assert_eq!(std::fs::read_dir(dir.path().join(sub)).unwrap().count(), 1);
        }

        // The second file cannot be made (its directory is a file): nothing changes.
        let blocked = dir.path().join("blocked");
        std::fs::write(&blocked, b"").unwrap();
        let c = blocked.join("c.json");
        assert!(write_all_atomic(&[(&a, b"a3"), (&c, b"c")]).is_err());
        assert_eq!(std::fs::read(&a).unwrap(), b"a2");
        assert_eq!(
            std::fs::read_dir(dir.path().join("one")).unwrap().count(),
            1
        );
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
