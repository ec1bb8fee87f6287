//! A copy-on-write view mounted into a container that already runs: what lets a warm pool
//! member, started with an empty workspace, take a snapshot's view in constant time instead of
//! being filled by a copy.
//!
//! The overlay (a snapshot's tree as its lower layer, a view's upper and work directories) is
//! made once with the kernel's mount API (`fsopen`, `fsconfig`, `fsmount`) and mounted twice,
//! both mounts of one file system: over the workspace volume's directory on this host (its
//! "twin", where everything the server does on the host path, a snapshot's read and the proof
//! that the directory is the container's included, finds it, and which Docker binds again when
//! the container restarts), and over `/workspace` inside the container's mount namespace, which
//! a thread of its own joins (`unshare(CLONE_FS)` then `setns`) and leaves with its end. Before
//! anything is mounted, the container's `/workspace` must be proven the volume's directory (same
//! device and inode) and the process the container's (its cgroup names it); any failure after
//! the twin is mounted takes the twin away again, so a failed call leaves no mount behind.
//!
//! This module owns those mounts and nothing else: it knows no Docker, no store, no sandbox. It
//! needs root on the daemon's host, in its mount namespace, and a kernel with the mount API;
//! it must not be used for gVisor, whose gofer keeps the directory it opened at the start.
//! Docker does not know of the twin: a volume carrying one must have it taken away
//! ([`unmount_all`]) before Docker removes the volume, or Docker deletes through it.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

// From <linux/mount.h>: the libc crate does not name every one of them.
const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
const OPEN_TREE_CLONE: libc::c_uint = 0x1;

/// Why a view was not mounted into a container.
#[derive(Debug, thiserror::Error)]
pub enum ViewMountError {
    /// Not possible here at all (no mount API, no permission, another PID namespace): worth
    /// remembering, every later try would fail the same way.
    #[error("views cannot be mounted into running containers here: {0}")]
    Unsupported(String),
    /// This container or this call: the container changed or went, or a mount failed.
    #[error("{0}")]
    Failed(String),
}

/// The directories of an overlay view: lower layers top first, then upper and work.
pub struct Overlay<'a> {
    pub lower: &'a [PathBuf],
    pub upper: &'a Path,
    pub work: &'a Path,
}

/// Mounts `overlay` over `host_dir` (the workspace volume's directory on this host) and over
/// `inside` (an absolute path, the workspace) in the mount namespace of `pid`, the host PID of
/// container `container_id`'s first process, whose `inside` must be `host_dir` itself. Blocks
/// briefly; call it off the async runtime's threads.
pub fn mount_into_running(
    overlay: &Overlay<'_>,
    host_dir: &Path,
    pid: i64,
    container_id: &str,
    inside: &str,
) -> Result<(), ViewMountError> {
    if pid <= 0 || container_id.len() < 12 || !inside.starts_with('/') {
        return Err(failed("the container has no process"));
    }
    let volume = std::fs::metadata(host_dir).map_err(|e| failed(format!("{host_dir:?}: {e}")))?;
    // The namespace and the workspace first, then the proofs: a PID reused in between fails the
    // cgroup proof, and the open files keep what they name.
    let namespace = File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(|e| failed(format!("mount namespace: {e}")))?;
    let workspace = open_path(&format!("/proc/{pid}/root{inside}"))?;
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| failed(format!("cgroup: {e}")))?;
    if !cgroups.contains(container_id) {
        return Err(unsupported(
            "the process is not the container's on this host",
        ));
    }
    let seen = identity(&workspace).map_err(|e| failed(format!("{inside}: {e}")))?;
    if seen != (volume.dev(), volume.ino()) {
        return Err(failed(format!(
            "the container's {inside} is not {}",
            host_dir.display()
        )));
    }
    let mounted = make_overlay(overlay)?;
    move_mount(&mounted, None, host_dir)?;
    let result =
        clone_mount(host_dir).and_then(|clone| mount_in_namespace(namespace, clone, workspace));
    if result.is_err() {
        let _ = unmount_all(host_dir);
    }
    result
}

/// Mounts `overlay` over `host_dir` on this host only: a view whose mount was lost (a reboot),
/// mounted again before its container starts and binds the directory.
pub fn mount_on_host(overlay: &Overlay<'_>, host_dir: &Path) -> Result<(), ViewMountError> {
    let mounted = make_overlay(overlay)?;
    move_mount(&mounted, None, host_dir)
}

/// Takes away every mount stacked at `dir` on this host (detached: whatever still uses one keeps
/// it until it lets go). Returns how many there were.
pub fn unmount_all(dir: &Path) -> io::Result<usize> {
    let path = c_path(dir)?;
    let mut count = 0;
    // SAFETY: a valid C string; umount2 has no other preconditions.
    while unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        count += 1;
    }
    let error = io::Error::last_os_error();
    // EINVAL: nothing (more) is mounted there.
    if count > 0 || error.raw_os_error() == Some(libc::EINVAL) {
        Ok(count)
    } else {
        Err(error)
    }
}

/// Whether this host's mount table (`/proc/self/mountinfo`) shows something mounted at `dir`.
pub fn is_mounted_at(table: &str, dir: &Path) -> bool {
    let Some(dir) = dir.to_str() else {
        return false;
    };
    table
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(dir))
}

/// A new, detached overlay mount of `overlay`.
fn make_overlay(overlay: &Overlay<'_>) -> Result<OwnedFd, ViewMountError> {
    let name = CString::new("overlay").expect("no NUL");
    // SAFETY: a valid C string; the descriptor returned is owned below.
    let context = owned(unsafe { libc::syscall(libc::SYS_fsopen, name.as_ptr(), FSOPEN_CLOEXEC) })
        .map_err(|e| unsupported(format!("fsopen(overlay): {e}")))?;
    let lower: Vec<&str> = overlay
        .lower
        .iter()
        .map(|p| {
            p.to_str()
                .ok_or_else(|| failed("a lower directory is not UTF-8"))
        })
        .collect::<Result<_, _>>()?;
    let text = |p: &Path| {
        p.to_str()
            .map(str::to_string)
            .ok_or_else(|| failed("not UTF-8"))
    };
    // index=on: hard links of the tree stay links when one of them is written (as Docker's
    // overlay volumes are mounted).
    let options = [
        ("lowerdir", lower.join(":")),
        ("upperdir", text(overlay.upper)?),
        ("workdir", text(overlay.work)?),
        ("index", "on".to_string()),
    ];
    for (key, value) in options {
        let (key_c, value_c) = (c_string(key)?, c_string(&value)?);
        // SAFETY: valid C strings and our own context descriptor.
        let set = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                context.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key_c.as_ptr(),
                value_c.as_ptr(),
                0,
            )
        };
        if set < 0 {
            return Err(failed(format!(
                "overlay {key}={value}: {}{}",
                io::Error::last_os_error(),
                kernel_message(&context)
            )));
        }
    }
    // SAFETY: our own context descriptor; no pointers.
    let created = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if created < 0 {
        return Err(failed(format!(
            "overlay: {}{}",
            io::Error::last_os_error(),
            kernel_message(&context)
        )));
    }
    // No set-user-ID programs and no device files through the view, whatever its content (the
    // restore rules refuse both already; a workspace never needs them).
    let attributes = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    // SAFETY: our own context descriptor; the mount descriptor returned is owned below.
    owned(unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            context.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            attributes,
        )
    })
    .map_err(|e| failed(format!("fsmount: {e}")))
}

/// What the kernel logged on a file system context (why an overlay was refused), if anything.
fn kernel_message(context: &OwnedFd) -> String {
    let mut buffer = [0u8; 512];
    // SAFETY: reading into a buffer of ours, at most its length.
    let read = unsafe {
        libc::read(
            context.as_raw_fd(),
            buffer.as_mut_ptr().cast(),
            buffer.len(),
        )
    };
    match usize::try_from(read) {
        Ok(n) if n > 0 => format!(" ({})", String::from_utf8_lossy(&buffer[..n]).trim()),
        _ => String::new(),
    }
}

/// A detached copy of the mount at `dir` (of the same file system).
fn clone_mount(dir: &Path) -> Result<OwnedFd, ViewMountError> {
    let path = c_path(dir).map_err(|e| failed(e.to_string()))?;
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: a valid C string; the descriptor returned is owned below.
    owned(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) })
        .map_err(|e| failed(format!("open_tree: {e}")))
}

/// Moves the detached mount `mount` to `to` (a path of this thread's namespace) or, with
/// `to_fd`, over the directory that descriptor names.
fn move_mount(mount: &OwnedFd, to_fd: Option<&OwnedFd>, to: &Path) -> Result<(), ViewMountError> {
    let empty = CString::default();
    let (dir_fd, path, flags) = match to_fd {
        Some(fd) => (
            fd.as_raw_fd(),
            empty.clone(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        ),
        None => (
            libc::AT_FDCWD,
            c_path(to).map_err(|e| failed(e.to_string()))?,
            MOVE_MOUNT_F_EMPTY_PATH,
        ),
    };
    // SAFETY: valid C strings and descriptors we hold open.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_raw_fd(),
            empty.as_ptr(),
            dir_fd,
            path.as_ptr(),
            flags,
        )
    };
    if moved < 0 {
        return Err(failed(format!(
            "move_mount to {}: {}",
            to.display(),
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Moves `mount` over `workspace` from a thread that joined the mount namespace `namespace`.
fn mount_in_namespace(
    namespace: File,
    mount: OwnedFd,
    workspace: OwnedFd,
) -> Result<(), ViewMountError> {
    // A thread of its own: joining a mount namespace changes the thread's file system context
    // for good (unshared first, as setns demands of a thread that shares it), and this one ends
    // with the move.
    let joined = std::thread::Builder::new()
        .name("view-mount".into())
        .spawn(move || {
            // SAFETY: unshare and setns act on this thread only; the descriptor is ours.
            if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
                return Err(unsupported(format!(
                    "unshare: {}",
                    io::Error::last_os_error()
                )));
            }
            // SAFETY: as above.
            if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNS) } != 0 {
                return Err(unsupported(format!(
                    "setns: {}",
                    io::Error::last_os_error()
                )));
            }
            move_mount(
                &mount,
                Some(&workspace),
                Path::new("the container's workspace"),
            )
        })
        .map_err(|e| failed(format!("thread: {e}")))?;
    joined
        .join()
        .map_err(|_| failed("the view-mount thread panicked"))?
}

/// An `O_PATH` descriptor of the directory `path` (its last component not followed).
fn open_path(path: &str) -> Result<OwnedFd, ViewMountError> {
    let c = c_string(path)?;
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid C string; the descriptor returned is owned below.
    owned(unsafe { libc::open(c.as_ptr(), flags) }.into())
        .map_err(|e| failed(format!("{path}: {e}")))
}

/// The device and inode of the file `fd` names.
fn identity(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    // SAFETY: fstat writes into the zeroed struct we own; the descriptor is open.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((stat.st_dev, stat.st_ino))
}

fn owned(result: libc::c_long) -> io::Result<OwnedFd> {
    match libc::c_int::try_from(result) {
        // SAFETY: a descriptor the kernel just returned, owned by nobody else.
        Ok(fd) if fd >= 0 => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        _ => Err(io::Error::last_os_error()),
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

fn c_string(text: &str) -> Result<CString, ViewMountError> {
    CString::new(text).map_err(|_| failed(format!("{text:?} holds a NUL")))
}

fn failed(message: impl Into<String>) -> ViewMountError {
    ViewMountError::Failed(message.into())
}

fn unsupported(message: impl Into<String>) -> ViewMountError {
    ViewMountError::Unsupported(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_point_is_found_by_its_exact_path() {
        let table = "\
58 45 0:50 / /var/lib/docker/volumes/v/_data rw,relatime shared:3 - overlay none rw,lowerdir=/t/k
59 45 0:51 / /var/lib/docker/volumes/v/_data/sub rw - ext4 /dev/vda rw
";
        assert!(is_mounted_at(
            table,
            Path::new("/var/lib/docker/volumes/v/_data")
        ));
        assert!(!is_mounted_at(
            table,
            Path::new("/var/lib/docker/volumes/v")
        ));
        assert!(!is_mounted_at(
            table,
            Path::new("/var/lib/docker/volumes/w/_data")
        ));
    }

    #[test]
    fn a_process_that_is_not_there_mounts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let lower = vec![dir.path().to_path_buf()];
        let overlay = Overlay {
            lower: &lower,
            upper: dir.path(),
            work: dir.path(),
        };
        let error = mount_into_running(&overlay, dir.path(), 0, "0123456789abcdef", "/workspace")
            .unwrap_err();
        assert!(matches!(error, ViewMountError::Failed(_)), "{error}");
        assert!(!is_mounted_at(
            &std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
            dir.path()
        ));
    }
}
