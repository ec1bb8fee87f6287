//! Disk limits for workspaces (`spec.diskMB`): each limited workspace is an ext4 file system of
//! its own, in an image file of the disks directory (`<volume>.img`, sparse, so it takes only
//! what is written), loop-mounted by this host's kernel at `<volume>/` beside it; the sandbox's
//! workspace is the directory `ws` on that file system, which Docker's `local` driver binds as
//! the workspace volume. A write past the size fails inside the sandbox with ENOSPC, whatever
//! the runtime (runc or runsc: both only see the directory), and the host's and the other
//! sandboxes' space is untouched. Raising the size applies live: the image grows, the loop device
//! learns its new size and `resize2fs` grows the mounted file system, under the running sandbox.
//!
//! This module owns those files and mounts and nothing else: it never talks to Docker (the
//! controller makes the volume) and knows nothing of sandboxes; the store names its directory.
//! Everything is crash-safe by construction: an image is made under a temporary name and renamed
//! once formatted; mounts are made with `mount -o loop`, whose loop device is released by the
//! kernel at the unmount (autoclear), so no loop device outlives its mount; a mount found missing
//! (after a reboot) is made again by [`Disks::ensure`] before its workspace is used; and
//! [`Disks::collect`] unmounts and removes every disk whose volume is gone (and temporary images
//! no call of this process is writing), so a kill at any point leaves nothing behind for long.
//!
//! It needs the server to run as root on the daemon's host, sharing its mount namespace, with
//! `mkfs.ext4`, `resize2fs`, `mount`, `umount` and `losetup` installed ([`Disks::unavailable`]
//! says what is missing). A remote daemon cannot find the directory to bind: its container start
//! fails, so a limit is never silently dropped.

use std::collections::HashMap;
use std::collections::HashSet;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

/// One MiB, the unit of `spec.diskMB`.
const MIB: u64 = 1 << 20;
/// The smallest file system made: ext4's journal and metadata need some room.
pub const MIN_DISK_MB: u64 = 8;
/// Prefix of an image being made.
const TEMP_PREFIX: &str = ".tmp-";
/// The workspace's directory on a disk's file system.
const WORKSPACE_DIR: &str = "ws";

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("disk limits cannot be enforced here: {0}")]
    Unavailable(String),
    #[error("{command} failed for the disk of {volume}: {message}")]
    Command {
        volume: String,
        command: &'static str,
        message: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0:?} cannot name a disk")]
    InvalidName(String),
}

pub type DiskResult<T> = Result<T, DiskError>;

/// The disks of one data directory.
pub struct Disks {
    dir: PathBuf,
    /// The size new images get (sparse): how far a limit can be raised without growing the
    /// file system.
    image_mb: u64,
    /// When this process last made or used each disk, so collection spares what Docker may not
    /// list a volume for yet.
    touched: Mutex<HashMap<String, Instant>>,
    /// Disks are made and changed one at a time (mkfs and resize are short; this keeps two
    /// reconciles of one volume from racing).
    busy: tokio::sync::Mutex<()>,
}

/// Whether `name` can be one file name here (volume names are plain).
fn plain(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> DiskError + '_ {
    move |source| DiskError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Runs `program` with `args`; its stderr is the error.
fn run(volume: &str, program: &'static str, args: &[&std::ffi::OsStr]) -> DiskResult<String> {
    let output = Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .output()
        .map_err(|e| DiskError::Command {
            volume: volume.to_string(),
            command: program,
            message: e.to_string(),
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(DiskError::Command {
            volume: volume.to_string(),
            command: program,
            message: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// Whether mount table `table` (`/proc/self/mountinfo`) has a mount at `at`; its device
/// (`/dev/loopN`) when it has.
fn mounted_at(table: &str, at: &Path) -> Option<String> {
    let at = at.to_str()?;
    table.lines().find_map(|line| {
        let mut halves = line.splitn(2, " - ");
        let (mount, fs) = (halves.next()?, halves.next()?);
        if mount.split(' ').nth(4) != Some(at) {
            return None;
        }
        Some(fs.split(' ').nth(1).unwrap_or_default().to_string())
    })
}

fn mount_table() -> DiskResult<String> {
    let path = Path::new("/proc/self/mountinfo");
    std::fs::read_to_string(path).map_err(io_at(path))
}

impl Disks {
    /// The disks kept in directory `dir` (made when the first disk is), each made `image_mb`
    /// MiB large (sparse) or as large as its first limit.
    pub fn new(dir: PathBuf, image_mb: u64) -> Disks {
        Disks {
            dir,
            image_mb,
            touched: Mutex::default(),
            busy: tokio::sync::Mutex::new(()),
        }
    }

    /// Why disks cannot be made here, or `None` when they can.
    pub fn unavailable(&self) -> Option<String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some(
                "the server does not run as root (it mounts a file system per workspace)".into(),
            );
        }
        for tool in ["mkfs.ext4", "resize2fs", "mount", "umount", "losetup"] {
            let found = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
                .iter()
                .any(|dir| Path::new(dir).join(tool).exists());
            if !found {
                return Some(format!("{tool} is not installed (e2fsprogs, util-linux)"));
            }
        }
        if self.bind_source("x").is_none() {
            return Some(format!(
                "the data directory's path {} cannot be given to Docker as a bind source \
                 (relative, or holding a comma, colon, equals sign or space)",
                self.dir.display()
            ));
        }
        None
    }

    fn image(&self, volume: &str) -> PathBuf {
        self.dir.join(format!("{volume}.img"))
    }

    fn mount_point(&self, volume: &str) -> PathBuf {
        self.dir.join(volume)
    }

    /// The host directory Docker binds as the workspace of `volume`; `None` when its path
    /// cannot be written into the volume's options.
    pub fn bind_source(&self, volume: &str) -> Option<PathBuf> {
        let path = self.mount_point(volume).join(WORKSPACE_DIR);
        let text = path.to_str()?;
        (path.is_absolute() && !text.contains([',', ':', '\\', '=', ' ', '\t', '\n']))
            .then_some(path)
    }

    /// Marks `volume`'s disk as in use now (collection spares it): call it once its volume exists.
    pub fn touch(&self, volume: &str) {
        self.touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(volume.to_string(), Instant::now());
    }

    /// Whether `volume` has a disk (its image exists).
    pub fn exists(&self, volume: &str) -> bool {
        plain(volume) && self.image(volume).is_file()
    }

    /// Makes `volume`'s disk unless it exists, mounts it unless it is mounted, and sets its
    /// limit to `limit_mb` MiB (0: the whole image), live: a raise lets the sandbox write more at
    /// once, a lowering makes writes fail until it uses less. The workspace directory is owned
    /// by `owner`. Returns the directory to bind as the workspace.
    pub async fn ensure(
        &self,
        volume: &str,
        limit_mb: u64,
        owner: (u32, u32),
    ) -> DiskResult<PathBuf> {
        if !plain(volume) {
            return Err(DiskError::InvalidName(volume.to_string()));
        }
        if let Some(reason) = self.unavailable() {
            return Err(DiskError::Unavailable(reason));
        }
        let source = self
            .bind_source(volume)
            .ok_or_else(|| DiskError::InvalidName(volume.to_string()))?;
        let limit_mb = match limit_mb {
            0 => 0,
            mb => mb.max(MIN_DISK_MB),
        };
        self.touch(volume);
        let _one_at_a_time = self.busy.lock().await;
        let image = self.image(volume);
        let mount_point = self.mount_point(volume);
        let dir = self.dir.clone();
        let name = volume.to_string();
        let image_mb = self.image_mb;
        tokio::task::spawn_blocking(move || {
            ensure_blocking(&dir, &name, &image, &mount_point, limit_mb, image_mb, owner)
        })
        .await
        .map_err(|e| DiskError::Unavailable(e.to_string()))??;
        self.touch(volume);
        Ok(source)
    }

    /// Sets the limit of `volume`'s disk (mounting it again if needed) when it has one; returns
    /// whether it has.
    pub async fn apply(&self, volume: &str, limit_mb: u64, owner: (u32, u32)) -> DiskResult<bool> {
        if !self.exists(volume) {
            return Ok(false);
        }
        self.ensure(volume, limit_mb, owner).await?;
        Ok(true)
    }

    /// Unmounts and removes `volume`'s disk (whose volume is gone); a missing one is no error.
    pub async fn remove(&self, volume: &str) -> DiskResult<()> {
        if !plain(volume) {
            return Ok(());
        }
        let _one_at_a_time = self.busy.lock().await;
        let image = self.image(volume);
        let mount_point = self.mount_point(volume);
        let name = volume.to_string();
        tokio::task::spawn_blocking(move || remove_blocking(&name, &image, &mount_point))
            .await
            .map_err(|e| DiskError::Unavailable(e.to_string()))?
    }

    /// [`Disks::remove`] once `volume` is gone, a failure only logged (collection retries it).
    pub async fn forget(&self, volume: &str) {
        if let Err(error) = self.remove(volume).await {
            tracing::warn!(volume, %error, "removing a workspace's disk failed");
        }
    }

    /// Removes the disks whose volume is not in `volumes` and that this process has not made or
    /// used since `listed` (when Docker was listed), and temporary images left by a crash.
    /// Returns how many were removed. The caller must have a complete view of the volumes.
    pub async fn collect(&self, listed: Instant, volumes: &HashSet<String>) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut names = HashSet::new();
        let mut temps = Vec::new();
        for entry in entries.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if file.starts_with(TEMP_PREFIX) {
                temps.push(entry.path());
            } else if let Some(volume) = file.strip_suffix(".img") {
                names.insert(volume.to_string());
            } else if entry.path().is_dir() {
                names.insert(file);
            }
        }
        let mut removed = 0;
        for volume in names {
            let recent = self
                .touched
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&volume)
                .is_some_and(|at| *at >= listed);
            if volumes.contains(&volume) || recent {
                continue;
            }
            tracing::info!(
                volume,
                "removing the disk of a workspace whose volume is gone"
            );
            match self.remove(&volume).await {
                Ok(()) => removed += 1,
                Err(error) => tracing::warn!(volume, %error, "a disk is kept"),
            }
        }
        // A make holds the lock: a temporary image seen without it is a crash's leftover.
        if let Ok(_idle) = self.busy.try_lock() {
            for temp in temps {
                if std::fs::remove_file(&temp).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}

fn ensure_blocking(
    dir: &Path,
    volume: &str,
    image: &Path,
    mount_point: &Path,
    limit_mb: u64,
    image_mb: u64,
    owner: (u32, u32),
) -> DiskResult<()> {
    if !image.is_file() {
        make_image(dir, volume, image, image_mb.max(limit_mb))?;
    }
    let device = match mounted_at(&mount_table()?, mount_point) {
        Some(device) => device,
        None => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(mount_point)
                .map_err(io_at(mount_point))?;
            // `loop` makes the loop device with autoclear: the unmount releases it.
            run(
                volume,
                "mount",
                &[
                    "-t".as_ref(),
                    "ext4".as_ref(),
                    "-o".as_ref(),
                    "loop,nosuid,nodev,noatime,discard".as_ref(),
                    image.as_os_str(),
                    mount_point.as_os_str(),
                ],
            )?;
            let device = mounted_at(&mount_table()?, mount_point).unwrap_or_default();
            // Direct I/O: the image's blocks are not cached a second time in the host's page
            // cache (the workspace's own file system caches them already).
            if let Err(error) = run(
                volume,
                "losetup",
                &["--direct-io=on".as_ref(), device.as_ref()],
            ) {
                tracing::debug!(%error, "the workspace's loop device keeps buffered I/O");
            }
            device
        }
    };
    let Some(loop_name) = device
        .strip_prefix("/dev/")
        .filter(|d| d.starts_with("loop"))
    else {
        return Err(DiskError::Command {
            volume: volume.to_string(),
            command: "mount",
            message: format!("the disk is mounted from {device:?}, not a loop device"),
        });
    };
    let (block, blocks) = blocks_of(mount_point)?;
    let limit_blocks = limit_mb.saturating_mul(MIB) / block;
    if limit_blocks > blocks {
        // Beyond what the file system holds: the image grows, the loop device learns its new
        // size, and the mounted file system grows to it (the kernel asks for CAP_SYS_RESOURCE).
        let bytes = limit_mb.saturating_mul(MIB).saturating_add(MIB * 64);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(image)
            .map_err(io_at(image))?;
        if file.metadata().map_err(io_at(image))?.len() < bytes {
            file.set_len(bytes).map_err(io_at(image))?;
            file.sync_all().map_err(io_at(image))?;
        }
        run(volume, "losetup", &["-c".as_ref(), device.as_ref()])?;
        run(volume, "resize2fs", &[device.as_ref()])?;
    }
    let (_, blocks) = blocks_of(mount_point)?;
    // The limit: every block beyond it is reserved, for everyone (root included), through the
    // file system's own reserve; a change applies at once. Not kept by the file system: set at
    // every mount, before the workspace is used.
    let reserved = match limit_mb {
        0 => 0,
        _ => blocks.saturating_sub(limit_blocks),
    };
    let knob = Path::new("/sys/fs/ext4")
        .join(loop_name)
        .join("reserved_clusters");
    let current = std::fs::read_to_string(&knob).map_err(io_at(&knob))?;
    if current.trim().parse::<u64>().ok() != Some(reserved) {
        std::fs::write(&knob, reserved.to_string()).map_err(io_at(&knob))?;
    }
    let workspace = mount_point.join(WORKSPACE_DIR);
    if !workspace.is_dir() {
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&workspace)
            .map_err(io_at(&workspace))?;
        std::os::unix::fs::chown(&workspace, Some(owner.0), Some(owner.1))
            .map_err(io_at(&workspace))?;
    }
    Ok(())
}

/// The block size of the file system mounted at `at` and how many blocks it has for files (its
/// own metadata and journal left out).
fn blocks_of(at: &Path) -> DiskResult<(u64, u64)> {
    let path = std::ffi::CString::new(at.as_os_str().as_encoded_bytes())
        .map_err(|_| DiskError::InvalidName(at.display().to_string()))?;
    // SAFETY: statvfs fills the zeroed struct it is given; the path is a valid C string.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(io_at(at)(std::io::Error::last_os_error()));
    }
    let block = (stat.f_frsize as u64).max(1);
    Ok((block, stat.f_blocks as u64))
}

/// Makes the sparse image `image` of `size_mb` MiB holding an empty ext4 file system, under a
/// temporary name renamed once complete.
fn make_image(dir: &Path, volume: &str, image: &Path, size_mb: u64) -> DiskResult<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_at(dir))?;
    let temp = dir.join(format!("{TEMP_PREFIX}{volume}-{}", std::process::id()));
    let made = (|| {
        let file = std::fs::File::create(&temp).map_err(io_at(&temp))?;
        // Room for the journal and metadata beside the limit.
        file.set_len(size_mb.saturating_mul(MIB).saturating_add(MIB * 64))
            .map_err(io_at(&temp))?;
        drop(file);
        run(
            volume,
            "mkfs.ext4",
            &[
                "-q".as_ref(),
                "-F".as_ref(),
                // No blocks reserved by uid: the limit is the file system's own reserve.
                "-m".as_ref(),
                "0".as_ref(),
                "-b".as_ref(),
                "4096".as_ref(),
                "-E".as_ref(),
                "root_owner=0:0,nodiscard,lazy_itable_init=1,lazy_journal_init=1".as_ref(),
                temp.as_os_str(),
            ],
        )?;
        std::fs::File::open(&temp)
            .and_then(|f| f.sync_all())
            .map_err(io_at(&temp))?;
        std::fs::rename(&temp, image).map_err(io_at(image))?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_at(dir))
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    made
}

fn remove_blocking(volume: &str, image: &Path, mount_point: &Path) -> DiskResult<()> {
    if mounted_at(&mount_table()?, mount_point).is_some() {
        run(volume, "umount", &[mount_point.as_os_str()])?;
    }
    match std::fs::remove_dir(mount_point) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io_at(mount_point)(e));
        }
        _ => {}
    }
    match std::fs::remove_file(image) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_at(image)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_is_found_by_its_mount_point_only() {
        let table = "\
36 25 7:0 / /d/disks/v rw,nosuid,nodev,noatime - ext4 /dev/loop3 rw,discard
37 25 7:1 / /d/disks/v2 rw - ext4 /dev/loop4 rw";
        assert_eq!(
            mounted_at(table, Path::new("/d/disks/v")).as_deref(),
            Some("/dev/loop3")
        );
        assert_eq!(mounted_at(table, Path::new("/d/disks")), None);
    }

    #[test]
    fn only_plain_names_and_paths_make_disks() {
        assert!(plain("agent-sandbox-a-workspace"));
        assert!(!plain("../x"));
        assert!(!plain(".tmp-x"));
        let disks = Disks::new(PathBuf::from("/d/disks"), 1024);
        assert_eq!(disks.bind_source("v"), Some(PathBuf::from("/d/disks/v/ws")));
        assert_eq!(
            Disks::new(PathBuf::from("/d,x"), 1024).bind_source("v"),
            None
        );
        assert_eq!(
            Disks::new(PathBuf::from("rel"), 1024).bind_source("v"),
            None
        );
    }
}
