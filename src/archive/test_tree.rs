//! A workspace-like tree the archive tests share: nested and empty directories, a read-only
//! directory with a file in it, a larger file, a hard link and an in-tree symlink. Each test adds
//! the oddities it is about.

use std::fs::Metadata;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// Plants the shared tree below `root`. `src/main.py` is hard-linked as `main-again.py`.
pub(super) fn plant(root: &Path) {
    std::fs::create_dir_all(root.join("src/deep/er")).unwrap();
    std::fs::create_dir(root.join("empty")).unwrap();
    std::fs::create_dir(root.join("locked")).unwrap();
    std::fs::write(root.join("src/main.py"), b"print('hi')\n").unwrap();
    std::fs::write(root.join("src/deep/er/data.bin"), vec![42u8; 300_000]).unwrap();
    std::fs::write(root.join("locked/inside"), b"in a read-only directory").unwrap();
    std::fs::hard_link(root.join("src/main.py"), root.join("main-again.py")).unwrap();
    symlink("src/main.py", root.join("rel-link")).unwrap();
}

/// Every entry below `dir` (symlinks not followed), with its name relative to `dir`, its path
/// and its metadata, in no particular order.
pub(super) fn entries(dir: &Path) -> Vec<(String, PathBuf, Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(current) = stack.pop() {
        for entry in std::fs::read_dir(&current).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path.clone());
            }
            let name = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.push((name, path, meta));
        }
    }
    out
}
