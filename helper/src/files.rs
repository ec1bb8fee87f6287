//! One-shot file modes of the helper, run as the sandbox user:
//!
//! - `write-file <path> <mode>`: writes stdin to `<path>` strictly inside `/workspace`, atomically
//!   (or in place, with `helper_protocol::WRITE_IN_PLACE` in the mode). `serve` does the same for
//!   `WriteFile` requests, through [`WriteJob`].
//! - `read-file <path> <max-bytes>`: copies a regular file to stdout (the kernel follows symlinks).
//! - `list-dir <path>`: one JSON object per entry of a directory, on stdout.
//!
//! A write resolves its path one component at a time from a held `/workspace` descriptor with
//! `openat(O_NOFOLLOW | O_DIRECTORY)`, creating missing directories (0755). A symbolic link met on
//! the way is read with `readlinkat` and followed only when its target, taken lexically, stays
//! inside `/workspace` (at most [`MAX_LINKS`] of them); then resolution restarts from the top.
//! The content goes to a new temporary file in the target directory (`O_CREAT | O_EXCL |
//! O_NOFOLLOW`), gets its mode, is synced and renamed over the target, so readers see the old or
//! the new file, never a part. An in-place write opens the target itself (`O_CREAT | O_TRUNC |
//! O_NOFOLLOW`; a link there is removed first, as a rename would replace it), sets its mode, then
//! writes. Because every step is relative to a descriptor already held, a
//! link swapped in during the write cannot redirect it. An existing directory at the target is
//! refused (not replaced); a link at the target is replaced by the file, not followed.
//!
//! Outcome: exit status 0, or one of the `helper_protocol::file_exit` codes with a one-line reason
//! on stderr; `write-file` also prints its outcome as one JSON line on stdout either way. The
//! server maps these codes (`src/dataplane/files.rs`). No allocation here depends on
//! anything but the path and the directory sizes; file contents are streamed.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use helper_protocol::{file_exit, WRITE_IN_PLACE};

const WORKSPACE: &str = "/workspace";
/// Symbolic links followed while resolving one write, like the kernel's limit.
const MAX_LINKS: usize = 40;

pub struct Fail {
    code: i32,
    message: String,
}

fn fail(code: i32, message: impl Into<String>) -> Fail {
    Fail {
        code,
        message: message.into(),
    }
}

fn os_fail(what: &str, e: io::Error) -> Fail {
    let code = match e.raw_os_error() {
        Some(libc::ENOENT) => file_exit::NOT_FOUND,
        Some(libc::ENOTDIR) => file_exit::NOT_DIR,
        Some(libc::EISDIR) => file_exit::IS_DIR,
        Some(libc::ELOOP) => file_exit::LOOP,
        Some(libc::EACCES) | Some(libc::EPERM) => file_exit::DENIED,
        _ => file_exit::OTHER,
    };
    fail(code, format!("{what}: {}", plain_error(&e)))
}

fn plain_error(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

fn cstring(s: &[u8]) -> Result<CString, Fail> {
    CString::new(s).map_err(|_| fail(file_exit::USAGE, "path contains a NUL byte"))
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn openat(dir: RawFd, name: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    loop {
        let fd = unsafe {
            libc::openat(
                dir,
                name.as_ptr(),
                flags | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        };
        if fd >= 0 {
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

fn lstatat(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

fn readlinkat(dir: RawFd, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// Lexical normalization of an absolute path: components without `.`, `..` or empties.
fn components(path: &[u8]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    for part in path.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                out.pop();
            }
            other => out.push(other.to_vec()),
        }
    }
    out
}

/// The components below `/workspace` of a normalized path, or `None` when it is not under it.
fn under_workspace(comps: &[Vec<u8>]) -> Option<Vec<Vec<u8>>> {
    match comps.split_first() {
        Some((first, rest)) if first.as_slice() == &WORKSPACE.as_bytes()[1..] => {
            Some(rest.to_vec())
        }
        _ => None,
    }
}

fn json_str(out: &mut String, bytes: &[u8]) {
    out.push('"');
    for c in String::from_utf8_lossy(bytes).chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn report(result: Result<(), Fail>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(f) => {
            let _ = writeln!(io::stderr(), "{}", f.message);
            f.code
        }
    }
}

// ------------------------------------------------------------------------------------------------
// write-file
// ------------------------------------------------------------------------------------------------

pub fn write_file_main(args: &[String]) -> i32 {
    let outcome = match args {
        [path, mode] => match u32::from_str_radix(mode, 8) {
            Ok(mode) if mode & !WRITE_IN_PLACE <= 0o7777 => write_file(path.as_bytes(), mode),
            _ => Err(fail(file_exit::USAGE, format!("invalid mode {mode:?}"))),
        },
        _ => Err(fail(
            file_exit::USAGE,
            "usage: agent-sandbox-helper write-file <path> <octal-mode>",
        )),
    };
    let (line, _, _) = outcome_line(&outcome);
    let _ = io::stdout().write_all(line.as_bytes());
    report(outcome.map(|_| ()))
}

/// Opens the directory that will hold the file and returns it with the file's name.
fn resolve_parent(path: &[u8]) -> Result<(OwnedFd, Vec<u8>, Vec<u8>), Fail> {
    let outside = || {
        fail(
            file_exit::OUTSIDE,
            format!(
                "{} leads outside {WORKSPACE}",
                String::from_utf8_lossy(path)
            ),
        )
    };
    if !path.starts_with(b"/") {
        return Err(outside());
    }
    let mut rest = under_workspace(&components(path)).ok_or_else(outside)?;
    if rest.is_empty() {
        return Err(outside());
    }
    let ws = cstring(WORKSPACE.as_bytes())?;
    let mut links = 0;
    'restart: loop {
        let mut dir = openat(
            libc::AT_FDCWD,
            &ws,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .map_err(|e| os_fail(WORKSPACE, e))?;
        let mut logical: Vec<Vec<u8>> = Vec::new();
        let Some((name, parents)) = rest.split_last() else {
            return Err(outside());
        };
        let mut i = 0;
        while i < parents.len() {
            let comp = &parents[i];
            let c = cstring(comp)?;
            match open_subdir(dir.as_raw_fd(), &c) {
                Ok(fd) => {
                    dir = fd;
                    logical.push(comp.clone());
                    i += 1;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    match cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) }) {
                        Ok(_) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                        Err(e) => return Err(os_fail(&shown(&logical, comp), e)),
                    }
                    // Open it on the next turn (it may have been replaced meanwhile: checked again).
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => {
                    let target = match readlinkat(dir.as_raw_fd(), &c) {
                        Ok(t) => t,
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                            return Err(fail(
                                file_exit::NOT_DIR,
                                format!("{} is not a directory", shown(&logical, comp)),
                            ))
                        }
                        Err(e) => return Err(os_fail(&shown(&logical, comp), e)),
                    };
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(fail(
                            file_exit::LOOP,
                            format!(
                                "{}: too many levels of symbolic links",
                                String::from_utf8_lossy(path)
                            ),
                        ));
                    }
                    let mut base: Vec<u8> = if target.starts_with(b"/") {
                        target
                    } else {
                        let mut b = format!("{WORKSPACE}/").into_bytes();
                        for l in &logical {
                            b.extend_from_slice(l);
                            b.push(b'/');
                        }
                        b.extend_from_slice(&target);
                        b
                    };
                    base.push(b'/');
                    let Some(mut next) = under_workspace(&components(&base)) else {
                        return Err(outside());
                    };
                    next.extend_from_slice(&parents[i + 1..]);
                    next.push(name.clone());
                    rest = next;
                    continue 'restart;
                }
                Err(e) => return Err(os_fail(&shown(&logical, comp), e)),
            }
        }
        return Ok((dir, name.clone(), shown(&logical, name).into_bytes()));
    }
}

/// Opens the directory `name` in `dir` without following a link, and proves it: the entry is
/// checked with `lstat` first and the opened descriptor must be that same inode. `O_NOFOLLOW`
/// alone is not trusted, since not every kernel (gVisor's, for one) honours it with
/// `O_DIRECTORY`. A link yields `ELOOP`, anything else but a directory `ENOTDIR`.
fn open_subdir(dir: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    for _ in 0..10 {
        let st = lstatat(dir, name)?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {}
            libc::S_IFLNK => return Err(io::Error::from_raw_os_error(libc::ELOOP)),
            _ => return Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
        }
        let fd = openat(
            dir,
            name,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )?;
        let opened = fstat(fd.as_raw_fd())?;
        if opened.st_dev == st.st_dev && opened.st_ino == st.st_ino {
            return Ok(fd);
        }
        // Swapped between the check and the open: look again.
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

fn shown(logical: &[Vec<u8>], last: &[u8]) -> String {
    let mut s = String::from(WORKSPACE);
    for l in logical
        .iter()
        .map(Vec::as_slice)
        .chain(std::iter::once(last))
    {
        s.push('/');
        s.push_str(&String::from_utf8_lossy(l));
    }
    s
}

fn temp_name(name: &[u8]) -> Vec<u8> {
    // `serve` writes several files in one process: a counter keeps their names apart.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let suffix = format!(
        ".agent-sandbox-{}-{seq}-{nanos:08x}.tmp",
        std::process::id()
    );
    let mut t = b".".to_vec();
    // Keep within NAME_MAX (255).
    t.extend_from_slice(&name[..name.len().min(200)]);
    t.extend_from_slice(suffix.as_bytes());
    t
}

/// What is at a write's target, if anything; a directory there is refused (never replaced).
fn refuse_directory(
    dir: &OwnedFd,
    name: &CStr,
    shown_path: &str,
) -> Result<Option<libc::stat>, Fail> {
    match lstatat(dir.as_raw_fd(), name) {
        Ok(st) if is_dir(&st) => Err(fail(
            file_exit::IS_DIR,
            format!("{shown_path} is a directory"),
        )),
        Ok(st) => Ok(Some(st)),
        Err(_) => Ok(None),
    }
}

/// Resolves the target directory and creates the temporary file in it. A directory removed
/// between the two (a concurrent `rm -rf`) is resolved again, a few times.
fn open_temp(path: &[u8]) -> Result<(OwnedFd, OwnedFd, Vec<u8>, CString, String), Fail> {
    let mut attempt = 0;
    loop {
        let (dir, name, shown_path) = resolve_parent(path)?;
        let shown_path = String::from_utf8_lossy(&shown_path).into_owned();
        let cname = cstring(&name)?;
        refuse_directory(&dir, &cname, &shown_path)?;
        let tmp = cstring(&temp_name(&name))?;
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        match openat(dir.as_raw_fd(), &tmp, flags, 0o600) {
            Ok(fd) => {
                // Prove the new file is where it should be (not reached through a link).
                let opened = fstat(fd.as_raw_fd()).map_err(|e| os_fail(&shown_path, e))?;
                let entry = lstatat(dir.as_raw_fd(), &tmp).map_err(|e| os_fail(&shown_path, e))?;
                if opened.st_ino != entry.st_ino || opened.st_dev != entry.st_dev {
                    return Err(fail(
                        file_exit::OUTSIDE,
                        format!("{shown_path} leads outside {WORKSPACE}"),
                    ));
                }
                return Ok((dir, fd, name, tmp, shown_path));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && attempt < 5 => attempt += 1,
            Err(e) => return Err(os_fail(&shown_path, e)),
        }
    }
}

/// Resolves the target's directory and opens the target itself for an in-place write, created
/// or truncated; a symbolic link at the target is removed first (the file replaces it).
fn open_in_place(path: &[u8]) -> Result<(OwnedFd, OwnedFd, Vec<u8>, String), Fail> {
    let (dir, name, shown_path) = resolve_parent(path)?;
    let shown_path = String::from_utf8_lossy(&shown_path).into_owned();
    let cname = cstring(&name)?;
    if let Some(st) = refuse_directory(&dir, &cname, &shown_path)? {
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), cname.as_ptr(), 0) })
                .map_err(|e| os_fail(&shown_path, e))?;
        }
    }
    // Non-blocking, so that a FIFO put at the target cannot hold the helper waiting for a
    // reader; whatever is not a regular file is refused before anything is written.
    let flags =
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_NONBLOCK;
    let fd = openat(dir.as_raw_fd(), &cname, flags, 0o600).map_err(|e| os_fail(&shown_path, e))?;
    let opened = fstat(fd.as_raw_fd()).map_err(|e| os_fail(&shown_path, e))?;
    if opened.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(fail(
            file_exit::OTHER,
            format!("{shown_path} is not a regular file"),
        ));
    }
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, 0) })
        .map_err(|e| os_fail(&shown_path, e))?;
    Ok((dir, fd, name, shown_path))
}

fn write_file(path: &[u8], mode: u32) -> Result<String, Fail> {
    let mut job = WriteJob::begin(path, mode)?;
    let mut stdin = io::stdin().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => job.feed(&buf[..n])?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(os_fail(&job.shown_path, e)),
        }
    }
    job.finish()
}

/// One write in progress: the content goes to a temporary file next to the target, which is
/// renamed over it by [`WriteJob::finish`]. Dropped unfinished, it removes the temporary file.
/// An in-place write (no `tmp`) goes to the target itself, and stays as far as it got.
pub struct WriteJob {
    dir: OwnedFd,
    file: File,
    name: Vec<u8>,
    tmp: Option<CString>,
    shown_path: String,
    mode: u32,
    committed: bool,
}

/// The outcome line of a write, as `write-file` prints it, and its exit status.
pub fn outcome_line(outcome: &Result<String, Fail>) -> (String, i32, String) {
    let mut line = String::new();
    let (code, message) = match outcome {
        Ok(info) => {
            line.push_str(info);
            (0, String::new())
        }
        Err(f) => {
            line.push_str(&format!("{{\"error\":{},\"message\":", f.code));
            json_str(&mut line, f.message.as_bytes());
            line.push('}');
            (f.code, f.message.clone())
        }
    };
    line.push('\n');
    (line, code, message)
}

impl WriteJob {
    /// Resolves `path` (confined to `/workspace`) and creates the temporary file.
    pub fn begin(path: &[u8], mode: u32) -> Result<WriteJob, Fail> {
        let in_place = mode & WRITE_IN_PLACE != 0;
        let mode = mode & !WRITE_IN_PLACE;
        if mode > 0o7777 {
            return Err(fail(file_exit::USAGE, format!("invalid mode {mode:o}")));
        }
        if in_place {
            let (dir, fd, name, shown_path) = open_in_place(path)?;
            // The mode is set before the content, as envd does (a watch sees create, chmod,
            // write).
            cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) })
                .map_err(|e| os_fail(&shown_path, e))?;
            return Ok(WriteJob {
                dir,
                file: File::from(fd),
                name,
                tmp: None,
                shown_path,
                mode,
                committed: false,
            });
        }
        let (dir, fd, name, tmp, shown_path) = open_temp(path)?;
        Ok(WriteJob {
            dir,
            file: File::from(fd),
            name,
            tmp: Some(tmp),
            shown_path,
            mode,
            committed: false,
        })
    }

    pub fn feed(&mut self, data: &[u8]) -> Result<(), Fail> {
        self.file
            .write_all(data)
            .map_err(|e| os_fail(&self.shown_path, e))
    }

    /// Sets the mode, syncs, and renames the file into place; returns the outcome line.
    pub fn finish(mut self) -> Result<String, Fail> {
        let cname = cstring(&self.name)?;
        let (dir, tmp, shown_path) = (
            self.dir.as_raw_fd(),
            self.tmp.clone(),
            self.shown_path.clone(),
        );
        let file = &self.file;
        let result = (|| -> Result<(), Fail> {
            let Some(tmp) = &tmp else {
                return file.sync_all().map_err(|e| os_fail(&shown_path, e));
            };
            cvt(unsafe { libc::fchmod(file.as_raw_fd(), self.mode as libc::mode_t) })
                .map_err(|e| os_fail(&shown_path, e))?;
            file.sync_all().map_err(|e| os_fail(&shown_path, e))?;
            cvt(unsafe { libc::renameat(dir, tmp.as_ptr(), dir, cname.as_ptr()) })
                .map_err(|e| os_fail(&shown_path, e))?;
            Ok(())
        })();
        if let Err(f) = result {
            if f.code == file_exit::IS_DIR {
                return Err(fail(
                    file_exit::IS_DIR,
                    format!("{shown_path} is a directory"),
                ));
            }
            return Err(f);
        }
        self.committed = true;
        // The rename is durable once the directory is synced.
        let _ = unsafe { libc::fsync(dir) };
        let st = fstat(self.file.as_raw_fd()).map_err(|e| os_fail(&shown_path, e))?;
        let mut line = String::from("{\"name\":");
        json_str(&mut line, &self.name);
        line.push_str(",\"path\":");
        json_str(&mut line, shown_path.as_bytes());
        line.push_str(&format!(
            ",\"size\":{},\"mtime\":{},\"mtime_nsec\":{}}}",
            st.st_size, st.st_mtime, st.st_mtime_nsec
        ));
        Ok(line)
    }
}

impl Drop for WriteJob {
    fn drop(&mut self) {
        if let (false, Some(tmp)) = (self.committed, &self.tmp) {
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), tmp.as_ptr(), 0) };
        }
    }
}

// ------------------------------------------------------------------------------------------------
// read-file
// ------------------------------------------------------------------------------------------------

pub fn read_file_main(args: &[String]) -> i32 {
    report(match args {
        [path, max] => match max.parse::<u64>() {
            Ok(max) => read_file(path, max),
            Err(_) => Err(fail(
                file_exit::USAGE,
                format!("invalid size limit {max:?}"),
            )),
        },
        _ => Err(fail(
            file_exit::USAGE,
            "usage: agent-sandbox-helper read-file <path> <max-bytes>",
        )),
    })
}

fn read_file(path: &str, max: u64) -> Result<(), Fail> {
    let c = cstring(path.as_bytes())?;
    // Non-blocking so that a FIFO cannot hang the open; the type is checked right after.
    let fd = openat(
        libc::AT_FDCWD,
        &c,
        libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK,
        0,
    )
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTDIR) => fail(file_exit::NOT_FOUND, format!("{path}: not found")),
        Some(libc::ENOENT) => fail(file_exit::NOT_FOUND, format!("{path}: not found")),
        Some(libc::ELOOP) => fail(
            file_exit::LOOP,
            format!("{path}: too many levels of symbolic links"),
        ),
        _ => os_fail(path, e),
    })?;
    let st = fstat(fd.as_raw_fd()).map_err(|e| os_fail(path, e))?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => {}
        libc::S_IFDIR => return Err(fail(file_exit::IS_DIR, format!("{path} is a directory"))),
        _ => {
            return Err(fail(
                file_exit::NOT_REGULAR,
                format!("{path} is not a regular file"),
            ))
        }
    }
    let too_large = || {
        fail(
            file_exit::TOO_LARGE,
            format!("{path} is larger than {max} bytes"),
        )
    };
    if st.st_size as u64 > max {
        return Err(too_large());
    }
    let mut file = File::from(fd);
    let mut out = io::stdout().lock();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total: u64 = 0;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(os_fail(path, e)),
        };
        total += n as u64;
        // The file grew past the limit while being read.
        if total > max {
            return Err(too_large());
        }
        out.write_all(&buf[..n]).map_err(|e| os_fail("stdout", e))?;
    }
    out.flush().map_err(|e| os_fail("stdout", e))
}

// ------------------------------------------------------------------------------------------------
// list-dir
// ------------------------------------------------------------------------------------------------

pub fn list_dir_main(args: &[String]) -> i32 {
    report(match args {
        [path] => list_dir(path),
        _ => Err(fail(
            file_exit::USAGE,
            "usage: agent-sandbox-helper list-dir <path>",
        )),
    })
}

fn list_dir(path: &str) -> Result<(), Fail> {
    let c = cstring(path.as_bytes())?;
    let fd =
        openat(libc::AT_FDCWD, &c, libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(|e| {
            match e.raw_os_error() {
                Some(libc::ENOENT) => fail(file_exit::NOT_FOUND, format!("{path}: not found")),
                Some(libc::ENOTDIR) | Some(libc::EACCES) => {
                    fail(file_exit::NOT_DIR, format!("{path} is not a directory"))
                }
                _ => os_fail(path, e),
            }
        })?;
    let raw = fd.as_raw_fd();
    // fdopendir takes ownership of the descriptor on success; keep a second one for fstatat.
    let dup =
        cvt(unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, 0) }).map_err(|e| os_fail(path, e))?;
    let dirp = unsafe { libc::fdopendir(dup) };
    if dirp.is_null() {
        let e = io::Error::last_os_error();
        unsafe { libc::close(dup) };
        return Err(os_fail(path, e));
    }
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut result = Ok(());
    loop {
        let entry = unsafe { libc::readdir(dirp) };
        if entry.is_null() {
            break;
        }
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        let bytes = name.to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        // An entry removed meanwhile is simply not listed.
        let Ok(st) = lstatat(raw, name) else { continue };
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => "file",
            libc::S_IFDIR => "directory",
            libc::S_IFLNK => "symlink",
            _ => "other",
        };
        let mut line = String::from("{\"name\":");
        json_str(&mut line, OsStr::from_bytes(bytes).as_bytes());
        line.push_str(&format!(
            ",\"type\":\"{kind}\",\"size\":{},\"mtime\":{}}}\n",
            st.st_size, st.st_mtime
        ));
        if let Err(e) = out.write_all(line.as_bytes()) {
            result = Err(os_fail("stdout", e));
            break;
        }
    }
    unsafe { libc::closedir(dirp) };
    result?;
    out.flush().map_err(|e| os_fail("stdout", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_components() {
        assert_eq!(
            components(b"/workspace/a/../b/./c/"),
            vec![b"workspace".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert_eq!(
            under_workspace(&components(b"/workspace/x")),
            Some(vec![b"x".to_vec()])
        );
        assert_eq!(under_workspace(&components(b"/workspace/../etc")), None);
        assert_eq!(under_workspace(&components(b"/workspacex/a")), None);
        assert_eq!(under_workspace(&components(b"/")), None);
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut s = String::new();
        json_str(&mut s, b"a\"b\\c\nd\xffe");
        assert_eq!(s, "\"a\\\"b\\\\c\\u000ad\u{fffd}e\"");
    }
}
