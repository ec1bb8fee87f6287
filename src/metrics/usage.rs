//! What a sandbox's container uses right now, read from the files the kernel keeps for it on
//! this host: its cgroup (CPU time, memory, processes) and its network namespace's interface
//! counters. Reading them costs a few small file reads per container and no Docker call, which
//! is what lets every scrape report every running sandbox.
//!
//! Docker puts each container in a cgroup named after its ID: `docker/<id>` below each v1
//! controller's hierarchy (the `cgroupfs` driver) or below the v2 root, or
//! `system.slice/docker-<id>.scope` (the `systemd` driver). Both versions and both drivers are
//! read here; [`Cgroups::discover`] finds the hierarchies from this process's mount table once.
//! Under gVisor the container's cgroup on this host holds the whole gVisor sandbox (its kernel,
//! its gofer), so the numbers are what the sandbox costs the host, not what its processes see.
//! When the daemon runs on another host there is no such cgroup and nothing is reported.

use std::path::{Path, PathBuf};

/// One sample of a container's cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CgroupUsage {
    /// CPU time used since the container started, user and system together.
    pub cpu_seconds: f64,
    /// Memory in use, less the page cache the kernel can drop at once (the "working set",
    /// as `docker stats` and the kubelet count it).
    pub memory_bytes: u64,
    /// The memory limit, when the cgroup has one.
    pub memory_limit_bytes: Option<u64>,
    /// Tasks (processes and threads) in the cgroup.
    pub pids: u64,
}

/// The cgroup hierarchies of this host, as mounted here.
#[derive(Clone, Debug, PartialEq)]
pub enum Cgroups {
    /// cgroup v1: one hierarchy per controller (a v2 hierarchy beside them without these
    /// controllers, as in the "hybrid" layout, is ignored).
    V1 {
        cpuacct: PathBuf,
        memory: PathBuf,
        pids: PathBuf,
    },
    /// cgroup v2: one unified hierarchy.
    V2 { root: PathBuf },
    /// No usable hierarchy (not Linux, or none mounted here).
    Unavailable,
}

impl Cgroups {
    /// The hierarchies mounted in this process's mount namespace.
    pub fn discover() -> Cgroups {
        match std::fs::read_to_string("/proc/self/mountinfo") {
            Ok(text) => Cgroups::from_mountinfo(&text),
            Err(_) => Cgroups::Unavailable,
        }
    }

    /// The hierarchies named by a `/proc/<pid>/mountinfo` text.
    pub fn from_mountinfo(text: &str) -> Cgroups {
        let (mut cpuacct, mut memory, mut pids, mut unified) = (None, None, None, None);
        for line in text.lines() {
            // `id parent major:minor root mountpoint options [optional...] - fstype source super`
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split(' ').nth(4).map(unescape);
            let mut right = right.split(' ');
            let (Some(fs_type), Some(mount_point)) = (right.next(), mount_point) else {
                continue;
            };
            let super_options: Vec<&str> = right.nth(1).unwrap_or("").split(',').collect();
            match fs_type {
                "cgroup" => {
                    for (controller, slot) in [
                        ("cpuacct", &mut cpuacct),
                        ("memory", &mut memory),
                        ("pids", &mut pids),
                    ] {
                        if super_options.contains(&controller) && slot.is_none() {
                            *slot = Some(mount_point.clone());
                        }
                    }
                }
                "cgroup2" if unified.is_none() => unified = Some(mount_point),
                _ => {}
            }
        }
        match (cpuacct, memory, pids, unified) {
            (Some(cpuacct), Some(memory), Some(pids), _) => Cgroups::V1 {
                cpuacct,
                memory,
                pids,
            },
            (None, None, None, Some(root)) => Cgroups::V2 { root },
            _ => Cgroups::Unavailable,
        }
    }

    /// The current usage of the container with this full ID, or `None` when it has no cgroup
    /// here (not running, or the daemon is on another host).
    pub fn read(&self, container_id: &str) -> Option<CgroupUsage> {
        if container_id.is_empty() || !container_id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return None;
        }
        match self {
            Cgroups::V1 {
                cpuacct,
                memory,
                pids,
            } => {
                let relative = container_dir(memory, container_id)?;
                let memory_dir = memory.join(&relative);
                let usage = read_number(&memory_dir.join("memory.usage_in_bytes"))?;
                let stat = std::fs::read_to_string(memory_dir.join("memory.stat")).ok();
                let inactive = stat
                    .as_deref()
                    .and_then(|s| stat_field(s, "total_inactive_file"))
                    .unwrap_or(0);
                // v1 reports "no limit" as the largest page-aligned value.
                let limit = read_number(&memory_dir.join("memory.limit_in_bytes"))
                    .filter(|l| *l < i64::MAX as u64 / 2);
                Some(CgroupUsage {
                    cpu_seconds: read_number(&cpuacct.join(&relative).join("cpuacct.usage"))
                        .unwrap_or(0) as f64
                        / 1e9,
                    memory_bytes: usage.saturating_sub(inactive),
                    memory_limit_bytes: limit,
                    pids: read_number(&pids.join(&relative).join("pids.current")).unwrap_or(0),
                })
            }
            Cgroups::V2 { root } => {
                let dir = root.join(container_dir(root, container_id)?);
                let current = read_number(&dir.join("memory.current"))?;
                let stat = std::fs::read_to_string(dir.join("memory.stat")).ok();
                let inactive = stat
                    .as_deref()
                    .and_then(|s| stat_field(s, "inactive_file"))
                    .unwrap_or(0);
                let cpu = std::fs::read_to_string(dir.join("cpu.stat")).ok();
                Some(CgroupUsage {
                    cpu_seconds: cpu
                        .as_deref()
                        .and_then(|s| stat_field(s, "usage_usec"))
                        .unwrap_or(0) as f64
                        / 1e6,
                    memory_bytes: current.saturating_sub(inactive),
                    // "max" (no limit) does not parse as a number.
                    memory_limit_bytes: read_number(&dir.join("memory.max")),
                    pids: read_number(&dir.join("pids.current")).unwrap_or(0),
                })
            }
            Cgroups::Unavailable => None,
        }
    }
}

/// The container's cgroup below `hierarchy`, under the names Docker's two cgroup drivers give it.
fn container_dir(hierarchy: &Path, id: &str) -> Option<PathBuf> {
    [
        PathBuf::from(format!("docker/{id}")),
        PathBuf::from(format!("system.slice/docker-{id}.scope")),
    ]
    .into_iter()
    .find(|relative| hierarchy.join(relative).is_dir())
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The value of `key` in a `key value` per line file (`memory.stat`, `cpu.stat`).
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Mount points in mountinfo escape space, tab, newline and backslash as octal.
fn unescape(field: &str) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(n) = u8::from_str_radix(digits, 8) {
                out.push(n);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Bytes received and sent by the network namespace of process `pid`, over every interface but
/// loopback (traffic inside the sandbox is not traffic of the sandbox). `None` when the process
/// is gone or its counters cannot be read here.
pub fn network_bytes(pid: i64) -> Option<(u64, u64)> {
    if pid <= 0 {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    Some(parse_net_dev(&text))
}

/// `(received, sent)` over the interfaces of a `/proc/net/dev` text, loopback left out.
pub fn parse_net_dev(text: &str) -> (u64, u64) {
    let (mut rx, mut tx) = (0u64, 0u64);
    for line in text.lines().skip(2) {
        let Some((name, counters)) = line.split_once(':') else {
            continue;
        };
        if name.trim() == "lo" {
            continue;
        }
        let fields: Vec<u64> = counters
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        if fields.len() >= 9 {
            rx = rx.saturating_add(fields[0]);
            tx = tx.saturating_add(fields[8]);
        }
    }
    (rx, tx)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
33 30 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:11 - cgroup2 cgroup2 rw
36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:15 - cgroup cgroup rw,cpu,cpuacct
37 30 0:33 / /sys/fs/cgroup/memory rw,nosuid shared:16 - cgroup cgroup rw,memory
38 30 0:34 / /sys/fs/cgroup/pids rw,nosuid shared:17 - cgroup cgroup rw,pids
";

    #[test]
    fn v1_controllers_win_over_an_empty_unified_hierarchy() {
        assert_eq!(
            Cgroups::from_mountinfo(HYBRID),
            Cgroups::V1 {
                cpuacct: "/sys/fs/cgroup/cpu,cpuacct".into(),
                memory: "/sys/fs/cgroup/memory".into(),
                pids: "/sys/fs/cgroup/pids".into(),
            }
        );
    }

    #[test]
    fn a_unified_hierarchy_alone_is_v2() {
        let text = "35 24 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            Cgroups::from_mountinfo(text),
            Cgroups::V2 {
                root: "/sys/fs/cgroup".into()
            }
        );
        assert_eq!(Cgroups::from_mountinfo(""), Cgroups::Unavailable);
    }

    #[test]
    fn escaped_mount_points_are_read_back() {
        assert_eq!(unescape("/a\\040b"), PathBuf::from("/a b"));
        assert_eq!(unescape("/plain"), PathBuf::from("/plain"));
    }

    #[test]
    fn a_v2_cgroup_is_read_from_its_files() {
        let root = tempfile::tempdir().unwrap();
        let id = "abc123";
        let dir = root
            .path()
            .join("system.slice")
            .join(format!("docker-{id}.scope"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.current"), "10485760\n").unwrap();
        std::fs::write(dir.join("memory.stat"), "anon 1\ninactive_file 1048576\n").unwrap();
        std::fs::write(dir.join("memory.max"), "max\n").unwrap();
        std::fs::write(dir.join("cpu.stat"), "usage_usec 2500000\nuser_usec 1\n").unwrap();
        std::fs::write(dir.join("pids.current"), "7\n").unwrap();
        let cgroups = Cgroups::V2 {
            root: root.path().into(),
        };
        assert_eq!(
            cgroups.read(id),
            Some(CgroupUsage {
                cpu_seconds: 2.5,
                memory_bytes: 9 * 1024 * 1024,
                memory_limit_bytes: None,
                pids: 7,
            })
        );
        assert_eq!(cgroups.read("other"), None);
        assert_eq!(cgroups.read("../x"), None);
    }

    #[test]
    fn loopback_is_not_counted() {
        let text = "Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n\
            lo: 500 5 0 0 0 0 0 0 500 5 0 0 0 0 0 0\n\
            eth0: 290 3 0 0 0 0 0 0 100 1 0 0 0 0 0 0\n";
        assert_eq!(parse_net_dev(text), (290, 100));
    }
}
