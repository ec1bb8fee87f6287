//! One directory watch of the process supervisor: an inotify instance on a directory (and, when
//! recursive, on every directory below it as they appear), its events translated into
//! `helper_protocol::supervisor::FsOp`s with names relative to the watched directory, queued for
//! the supervisor to hand out (`supervisor.rs` owns the watchers, their connections and limits).
//!
//! Bounded: at most `max_dirs` directories watched and `max_queued` events waiting; past either,
//! the watcher fails (with a message saying events were lost) rather than growing or silently
//! dropping events. The kernel's own limits (`fs.inotify.max_user_instances`,
//! `max_user_watches`) and its queue overflow fail it the same way. It never follows a symbolic
//! link below the watched directory. It runs as the sandbox user, so it sees exactly the
//! directories that user may read.

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

use helper_protocol::supervisor::{ErrorCode, FsOp, WatchStart};

use crate::sys;

/// What each watched directory is asked to report.
const MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF;

pub type Failure = (ErrorCode, String);

pub struct Watcher {
    pub id: String,
    fd: OwnedFd,
    root: String,
    recursive: bool,
    /// Watch descriptor to the directory's path relative to the root ("" for the root).
    dirs: HashMap<i32, String>,
    root_wd: i32,
    max_dirs: usize,
    max_queued: usize,
    pub queue: VecDeque<(FsOp, String)>,
    /// Why it stopped; events queued before stay to be handed out.
    pub failed: Option<Failure>,
    /// Streamed on a connection (removed with it), or detached (asked for its events).
    pub follow: bool,
    pub last_asked: Instant,
    pub idle_ms: u64,
}

fn os_failure(errno: i32, path: &str) -> Failure {
    match errno {
        libc::ENOENT => (ErrorCode::NotFound, format!("path {path} not found")),
        libc::ENOTDIR => (
            ErrorCode::Invalid,
            format!("path {path} is not a directory"),
        ),
        libc::EACCES | libc::EPERM => (
            ErrorCode::Denied,
            format!("the sandbox user may not read {path}"),
        ),
        libc::ENOSPC => (
            ErrorCode::TooMany,
            "the kernel's limit of watched directories (fs.inotify.max_user_watches) is reached"
                .to_string(),
        ),
        libc::EMFILE => (
            ErrorCode::TooMany,
            "the kernel's limit of directory watches (fs.inotify.max_user_instances) is reached"
                .to_string(),
        ),
        e => (
            ErrorCode::Internal,
            format!("cannot watch {path}: {}", sys::strerror(e)),
        ),
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

impl Watcher {
    pub fn start(id: String, w: &WatchStart) -> Result<Watcher, Failure> {
        if !w.path.starts_with('/') {
            return Err((
                ErrorCode::Invalid,
                format!("path {} is not absolute", w.path),
            ));
        }
        // SAFETY: inotify_init1 takes flags only; a valid descriptor is owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(os_failure(sys::errno(), &w.path));
        }
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let root = w.path.trim_end_matches('/').to_string();
        let mut watcher = Watcher {
            id,
            fd,
            root: if root.is_empty() { "/".into() } else { root },
            recursive: w.recursive,
            dirs: HashMap::new(),
            root_wd: -1,
            max_dirs: w.max_dirs.max(1) as usize,
            max_queued: w.max_queued.max(1) as usize,
            queue: VecDeque::new(),
            failed: None,
            follow: w.follow,
            last_asked: Instant::now(),
            idle_ms: w.idle_ms,
        };
        watcher.root_wd = watcher.add_watch("", libc::IN_ONLYDIR)?;
        if watcher.recursive {
            watcher.add_below("", false)?;
        }
        Ok(watcher)
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    fn full(&self, rel: &str) -> String {
        match (self.root.as_str(), rel) {
            (root, "") => root.to_string(),
            ("/", rel) => format!("/{rel}"),
            (root, rel) => format!("{root}/{rel}"),
        }
    }

    fn add_watch(&mut self, rel: &str, extra: u32) -> Result<i32, Failure> {
        let path = self.full(rel);
        if self.dirs.len() >= self.max_dirs {
            return Err((
                ErrorCode::TooMany,
                format!(
                    "the watch of {} would cover more than {} directories",
                    self.root, self.max_dirs
                ),
            ));
        }
        let c = CString::new(path.clone())
            .map_err(|_| (ErrorCode::Invalid, "the path holds a NUL byte".to_string()))?;
        // SAFETY: a valid descriptor and a NUL-terminated path.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), c.as_ptr(), MASK | extra) };
        if wd < 0 {
            return Err(os_failure(sys::errno(), &path));
        }
        self.dirs.insert(wd, rel.to_string());
        Ok(wd)
    }

    /// Watches every directory below `rel` (already watched); with `announce`, each entry
    /// found is reported created (it appeared before its directory was watched).
    fn add_below(&mut self, rel: &str, announce: bool) -> Result<(), Failure> {
        let mut pending = vec![rel.to_string()];
        while let Some(dir) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(self.full(&dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                let child = join(&dir, &name);
                if announce {
                    self.push(FsOp::Create, child.clone());
                }
                // The entry's own type: a symbolic link to a directory is not followed.
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    match self.add_watch(&child, libc::IN_ONLYDIR | libc::IN_DONT_FOLLOW) {
                        Ok(_) => pending.push(child),
                        // Gone or replaced meanwhile, or unreadable: nothing to watch there.
                        Err((ErrorCode::NotFound | ErrorCode::Invalid | ErrorCode::Denied, _)) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(())
    }

    /// Stops watching `rel` and everything below it (it moved away).
    fn forget_below(&mut self, rel: &str) {
        let prefix = format!("{rel}/");
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, d)| *d == rel || d.starts_with(&prefix))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            // SAFETY: a valid descriptor; a stale wd only makes it fail.
            unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
        }
    }

    pub fn fail(&mut self, code: ErrorCode, message: String) {
        if self.failed.is_none() {
            self.failed = Some((code, message));
        }
    }

    fn push(&mut self, op: FsOp, name: String) {
        if self.failed.is_some() {
            return;
        }
        // A burst of writes to one file is one event until it is handed out.
        if self
            .queue
            .back()
            .is_some_and(|(o, n)| *o == op && *n == name)
        {
            return;
        }
        if self.queue.len() >= self.max_queued {
            let message = format!(
                "more than {} events of the watch of {} were waiting to be read: events were lost",
                self.max_queued, self.root
            );
            self.fail(ErrorCode::TooMany, message);
            return;
        }
        self.queue.push_back((op, name));
    }

    /// Reads what the kernel has for this watcher.
    pub fn read(&mut self, buf: &mut [u8]) {
        loop {
            let n = match sys::read(self.fd.as_raw_fd(), buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let mut at = 0;
            let head = std::mem::size_of::<libc::inotify_event>();
            while at + head <= n {
                // SAFETY: the kernel writes whole events; the header is read unaligned.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                let end = (at + head + ev.len as usize).min(n);
                let raw = &buf[at + head..end];
                let name = raw.split(|b| *b == 0).next().unwrap_or(&[]);
                let name = String::from_utf8_lossy(name).into_owned();
                self.event(ev.wd, ev.mask, name);
                at = end;
            }
        }
    }

    fn event(&mut self, wd: i32, mask: u32, name: String) {
        if mask & libc::IN_Q_OVERFLOW != 0 {
            let message = format!(
                "the kernel's event queue for the watch of {} overflowed: events were lost",
                self.root
            );
            self.fail(ErrorCode::TooMany, message);
            return;
        }
        if mask & libc::IN_IGNORED != 0 {
            self.dirs.remove(&wd);
            if wd == self.root_wd {
                let message = format!("the watched directory {} was removed", self.root);
                self.fail(ErrorCode::NotFound, message);
            }
            return;
        }
        let Some(dir) = self.dirs.get(&wd).cloned() else {
            return;
        };
        if name.is_empty() {
            // About the directory itself: its parent reports it (or, for the root, IN_IGNORED).
            return;
        }
        let path = join(&dir, &name);
        let is_dir = mask & libc::IN_ISDIR != 0;
        let op = if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
            FsOp::Create
        } else if mask & libc::IN_MODIFY != 0 {
            FsOp::Write
        } else if mask & libc::IN_DELETE != 0 {
            FsOp::Remove
        } else if mask & libc::IN_MOVED_FROM != 0 {
            FsOp::Rename
        } else if mask & libc::IN_ATTRIB != 0 {
            FsOp::Chmod
        } else {
            return;
        };
        self.push(op, path.clone());
        if !self.recursive || !is_dir {
            return;
        }
        match op {
            FsOp::Create => {
                let added = self
                    .add_watch(&path, libc::IN_ONLYDIR | libc::IN_DONT_FOLLOW)
                    .and_then(|_| self.add_below(&path, true));
                match added {
                    Ok(()) | Err((ErrorCode::NotFound | ErrorCode::Invalid, _)) => {}
                    Err((ErrorCode::Denied, _)) => {}
                    Err((code, message)) => self.fail(code, message),
                }
            }
            FsOp::Rename => self.forget_below(&path),
            _ => {}
        }
    }

    /// A detached watcher nobody asked for its events for longer than it may wait.
    pub fn idle(&self, now: Instant) -> bool {
        !self.follow
            && self.idle_ms > 0
            && now.saturating_duration_since(self.last_asked).as_millis() > u128::from(self.idle_ms)
    }
}
