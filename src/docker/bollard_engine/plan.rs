//! Turns a [`ContainerPlan`] into Docker's create body: the one place where the security model
//! becomes container settings. Pure (no I/O), so every property is unit-tested here; nothing in
//! this file may offer a way to weaken the model (no privileged, capabilities, devices or host
//! namespaces, and no bind but the read-only hosts file of the server's own helper volume).

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountType, MountVolumeOptions, ResourcesUlimits,
};

use crate::docker::{
    ContainerPlan, EngineError, EngineResult, HELPER_BINARY, HELPER_MOUNT, LABEL_ID, LABEL_MANAGED,
    LABEL_SERVER, LABEL_SPEC_HASH, LABEL_UID,
};

/// Fixed part of the host pids granted to a gVisor container beyond its sandbox's own processes:
/// the container's pids cgroup counts gVisor's host threads (its sentry, gofer and, under the
/// systrap platform, one stub thread per guest thread), not the sandbox's processes. Measured under
/// systrap (`scripts/install-runsc.sh`): about 30 host threads at rest, 164 after a storm at
/// `pidsLimit: 64`, 317 with 248 busy processes at `pidsLimit: 256`.
pub const RUNSC_PIDS_HEADROOM: u64 = 1024;

/// The pids cgroup limit of a gVisor container whose sandbox may hold `pids_limit` processes and
/// threads: one host thread for each of them, one more for gVisor's per-process share (measured at
/// most 1.1 beyond the process itself), and [`RUNSC_PIDS_HEADROOM`]. It is a host-side backstop
/// against gVisor itself; the sandbox's own bound is its `RLIMIT_NPROC`.
pub fn gvisor_pids_limit(pids_limit: u64) -> u64 {
    pids_limit
        .saturating_mul(2)
        .saturating_add(RUNSC_PIDS_HEADROOM)
}

/// Under runsc the declared pids limit becomes the sandbox user's `RLIMIT_NPROC` (soft and hard),
/// which gVisor's kernel counts per sandbox: the pids cgroup there counts gVisor's host threads,
/// not the sandbox's processes, so without it nothing would refuse a process beyond the limit and
/// a process storm would spend the headroom and take the whole sandbox down. Never under runc,
/// where the host kernel counts a uid's processes across every container on the host.
pub const RUNSC_NPROC_ULIMIT: &str = "nproc";
/// Where the workspace volume is mounted; also the sandbox user's home and working directory.
pub const WORKSPACE: &str = "/workspace";
/// Hostname every sandbox sees.
pub const HOSTNAME: &str = "sandbox";
/// Main process when no helper volume is mounted: sleeps until told to stop, in any image with a
/// POSIX shell. The `sleep & wait` lets the TERM trap run at once instead of after the sleep.
pub const SHELL_IDLE: &str = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done";

const MIB: i64 = 1024 * 1024;

/// The create body for `plan`. Fails only on values Docker would misread (an environment key
/// that is empty or holds `=` or NUL, limits that overflow).
///
/// `loopback_hosts` is the daemon-side path of the helper volume's hosts file. Given it, a
/// sandbox without a network is created with networking disabled: still in a network namespace
/// of its own holding only `lo`, but without the network sandbox Docker would build for the
/// `none` network, which is most of the cost of starting and renaming a container. Docker then
/// writes no `/etc/hosts`, so the helper volume's copy is bound there, read-only, for `localhost`
/// to resolve in images that bring none.
pub fn create_body(
    plan: &ContainerPlan,
    loopback_hosts: Option<&str>,
) -> EngineResult<ContainerCreateBody> {
    let invalid = |message: String| EngineError::Docker {
        operation: format!(
            "create container {}",
            crate::docker::container_name(&plan.sandbox)
        ),
        message,
    };

    // HOME is part of the model (the workspace is home), so the plan's env cannot move it.
    let mut env = vec![format!("HOME={WORKSPACE}")];
    for (key, value) in &plan.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(invalid(format!(
                "invalid environment variable name {key:?}"
            )));
        }
        if key != "HOME" {
            env.push(format!("{key}={value}"));
        }
    }

    let memory = memory_bytes(plan.memory_mb)
        .ok_or_else(|| invalid(format!("memory of {} MiB is out of range", plan.memory_mb)))?;
    // Under gVisor the container's pids cgroup counts gVisor's host threads, and the declared
    // limit becomes the sandbox user's RLIMIT_NPROC, which gVisor's kernel enforces.
    let gvisor = plan
        .runtime
        .as_deref()
        .is_some_and(crate::docker::is_gvisor);
    let out_of_range = || invalid(format!("pids limit {} is out of range", plan.pids_limit));
    let nproc = i64::try_from(plan.pids_limit).map_err(|_| out_of_range())?;
    let pids = if gvisor {
        i64::try_from(gvisor_pids_limit(plan.pids_limit)).map_err(|_| out_of_range())?
    } else {
        nproc
    };
    let ulimits = gvisor.then(|| {
        vec![ResourcesUlimits {
            name: Some(RUNSC_NPROC_ULIMIT.into()),
            soft: Some(nproc),
            hard: Some(nproc),
        }]
    });
    let nano_cpus = nano_cpus(plan.cpus).ok_or_else(|| invalid(format!("cpus {}", plan.cpus)))?;

    let labels = HashMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_ID.to_string(), plan.sandbox.clone()),
        (LABEL_UID.to_string(), plan.uid.clone()),
        (LABEL_SERVER.to_string(), plan.server.clone()),
        (LABEL_SPEC_HASH.to_string(), plan.spec_hash.clone()),
    ]);

    let mut workspace = volume_mount(&plan.workspace_volume, WORKSPACE, false);
    // A workspace volume that does not exist yet is made by this very create, labeled: never
    // a moment when it exists without its container (garbage collection could take it) or
    // without its labels.
    if let Some(options) = workspace.volume_options.as_mut() {
        options.labels = Some(HashMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_SERVER.to_string(), plan.server.clone()),
            (LABEL_ID.to_string(), plan.sandbox.clone()),
            (LABEL_UID.to_string(), plan.uid.clone()),
        ]));
    }
    let mut mounts = vec![workspace];
    // The image's entrypoint never runs: Entrypoint and Cmd are always both set.
    let (entrypoint, cmd) = match &plan.helper_volume {
        Some(helper) => {
            mounts.push(volume_mount(helper, HELPER_MOUNT, true));
            (
                vec![format!("{HELPER_MOUNT}/{HELPER_BINARY}")],
                vec!["idle".to_string()],
            )
        }
        None => (
            vec!["/bin/sh".to_string(), "-c".to_string()],
            vec![SHELL_IDLE.to_string()],
        ),
    };

    if let Some(ca_dir) = &plan.ca_dir {
        mounts.push(read_only_file(ca_dir, crate::docker::CA_MOUNT));
    }

    let loopback_hosts = loopback_hosts.filter(|_| plan.network.is_none());
    if let Some(hosts) = loopback_hosts {
        mounts.push(read_only_file(hosts, "/etc/hosts"));
    }

    let host_config = HostConfig {
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(vec![]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        privileged: Some(false),
        readonly_rootfs: Some(plan.read_only_rootfs),
        // Docker adds noexec itself unless the options say `exec`; /tmp stays noexec.
        tmpfs: Some(HashMap::from([(
            "/tmp".to_string(),
            format!("rw,nosuid,nodev,size={}m", plan.tmp_size_mb),
        )])),
        network_mode: Some(plan.network.clone().unwrap_or_else(|| "none".into())),
        dns: (!plan.dns.is_empty()).then(|| plan.dns.iter().map(ToString::to_string).collect()),
        memory: Some(memory),
        memory_swap: Some(memory),
        nano_cpus: Some(nano_cpus),
        pids_limit: Some(pids),
        ulimits,
        ipc_mode: Some("private".into()),
        init: Some(true),
        runtime: plan.runtime.clone(),
        devices: Some(vec![]),
        binds: Some(vec![]),
        mounts: Some(mounts),
        ..Default::default()
    };

    Ok(ContainerCreateBody {
        image: Some(plan.image.clone()),
        user: Some(plan.user.clone()),
        env: Some(env),
        working_dir: Some(WORKSPACE.into()),
        hostname: Some(HOSTNAME.into()),
        entrypoint: Some(entrypoint),
        cmd: Some(cmd),
        labels: Some(labels),
        attach_stdin: Some(false),
        open_stdin: Some(false),
        tty: Some(false),
        host_config: Some(host_config),
        network_disabled: Some(loopback_hosts.is_some()),
        ..Default::default()
    })
}

/// A read-only bind of one file (or directory) the server owns. Propagation stays Docker's default (`rslave`):
/// Docker refuses private propagation for sources under its own root, where volumes live.
fn read_only_file(source: &str, target: &str) -> Mount {
    Mount {
        typ: Some(MountType::BIND),
        source: Some(source.to_string()),
        target: Some(target.to_string()),
        read_only: Some(true),
        ..Default::default()
    }
}

/// A named-volume mount. `no_copy`, because Docker would otherwise copy the image's content at
/// the target into an empty volume and reset the volume root's owner to the image's on every new
/// container, undoing `prepare_workspace`.
pub fn volume_mount(volume: &str, target: &str, read_only: bool) -> Mount {
    Mount {
        typ: Some(MountType::VOLUME),
        source: Some(volume.to_string()),
        target: Some(target.to_string()),
        read_only: Some(read_only),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// CPUs as Docker's NanoCpus; `None` for values that are not positive and finite.
pub fn nano_cpus(cpus: f64) -> Option<i64> {
    let nanos = (cpus * 1e9).round();
    (cpus.is_finite() && cpus > 0.0 && nanos >= 1.0 && nanos < i64::MAX as f64)
        .then_some(nanos as i64)
}

/// Memory in bytes for a limit in MiB.
pub fn memory_bytes(memory_mb: u64) -> Option<i64> {
    i64::try_from(memory_mb).ok()?.checked_mul(MIB)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn plan() -> ContainerPlan {
        ContainerPlan {
            sandbox: "demo".into(),
            name: None,
            uid: "u-1".into(),
            server: "s-1".into(),
            image: "img:1".into(),
            cpus: 1.5,
            memory_mb: 256,
            pids_limit: 64,
            network: None,
            read_only_rootfs: true,
            env: BTreeMap::from([
                ("FOO".to_string(), "bar".to_string()),
                ("HOME".to_string(), "/root".to_string()),
            ]),
            dns: Vec::new(),
            tmp_size_mb: 32,
            user: "1000:1000".into(),
            runtime: None,
            spec_hash: "h".into(),
            helper_volume: None,
            workspace_volume: "agent-sandbox-demo-workspace".into(),
            ca_dir: None,
            workspace_disk_mb: 0,
        }
    }

    #[test]
    fn hardening_is_complete() {
        let body = create_body(&plan(), None).unwrap();
        let hc = body.host_config.clone().unwrap();
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.cap_add, Some(vec![]));
        assert_eq!(hc.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(hc.privileged, Some(false));
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(body.network_disabled, Some(false));
        assert_eq!(hc.memory, Some(256 * MIB));
        assert_eq!(hc.memory_swap, hc.memory);
        assert_eq!(hc.nano_cpus, Some(1_500_000_000));
        assert_eq!(hc.pids_limit, Some(64));
        // Under runc the host kernel would count the uid across containers: no nproc limit.
        assert_eq!(hc.ulimits, None);
        assert_eq!(hc.ipc_mode.as_deref(), Some("private"));
        assert_eq!(hc.init, Some(true));
        assert_eq!(hc.devices, Some(vec![]));
        assert_eq!(hc.binds, Some(vec![]));
        assert_eq!(
            hc.tmpfs.unwrap().get("/tmp").map(String::as_str),
            Some("rw,nosuid,nodev,size=32m")
        );
        let mounts = hc.mounts.unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].target.as_deref(), Some("/workspace"));
        assert_eq!(mounts[0].read_only, Some(false));
        let options = mounts[0].volume_options.clone().unwrap();
        assert_eq!(options.no_copy, Some(true));
        let volume_labels = options.labels.unwrap();
        assert_eq!(
            volume_labels.get(LABEL_MANAGED).map(String::as_str),
            Some("true")
        );
        assert_eq!(
            volume_labels.get(LABEL_ID).map(String::as_str),
            Some("demo")
        );
        assert_eq!(
            volume_labels.get(LABEL_SERVER).map(String::as_str),
            Some("s-1")
        );
        assert!(volume_labels.contains_key(LABEL_UID));
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        assert_eq!(body.hostname.as_deref(), Some("sandbox"));
        assert_eq!(body.working_dir.as_deref(), Some("/workspace"));
        assert_eq!(body.entrypoint.unwrap()[0], "/bin/sh");
        let labels = body.labels.unwrap();
        assert_eq!(labels.get(LABEL_MANAGED).map(String::as_str), Some("true"));
        assert_eq!(labels.get(LABEL_ID).map(String::as_str), Some("demo"));
        assert_eq!(labels.get(LABEL_SERVER).map(String::as_str), Some("s-1"));
    }

    #[test]
    fn under_runsc_the_pids_limit_is_the_sandbox_users_nproc_limit() {
        // A variant registered beside `runsc` (another release or platform) is gVisor too.
        for runtime in ["runsc", "runsc-kvm"] {
            let mut p = plan();
            p.runtime = Some(runtime.into());
            let hc = create_body(&p, None).unwrap().host_config.unwrap();
            assert_eq!(hc.pids_limit, Some(2 * 64 + RUNSC_PIDS_HEADROOM as i64));
            let ulimits = hc.ulimits.unwrap();
            assert_eq!(ulimits.len(), 1);
            assert_eq!(ulimits[0].name.as_deref(), Some("nproc"));
            assert_eq!((ulimits[0].soft, ulimits[0].hard), (Some(64), Some(64)));
        }
        // A name that merely contains it is not.
        let mut p = plan();
        p.runtime = Some("myrunsc".into());
        let hc = create_body(&p, None).unwrap().host_config.unwrap();
        assert_eq!((hc.pids_limit, hc.ulimits), (Some(64), None));
    }

    #[test]
    fn home_cannot_be_overridden() {
        let env = create_body(&plan(), None).unwrap().env.unwrap();
        assert_eq!(
            env,
            vec!["HOME=/workspace".to_string(), "FOO=bar".to_string()]
        );
    }

    #[test]
    fn helper_volume_is_read_only_and_runs_idle() {
        let mut p = plan();
        p.helper_volume = Some("helper-vol".into());
        p.network = Some("agent-sandbox-net".into());
        let body = create_body(&p, None).unwrap();
        let hc = body.host_config.unwrap();
        let mounts = hc.mounts.unwrap();
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[1].target.as_deref(), Some(HELPER_MOUNT));
        assert_eq!(mounts[1].read_only, Some(true));
        assert_eq!(hc.network_mode.as_deref(), Some("agent-sandbox-net"));
        assert_eq!(
            body.entrypoint.unwrap(),
            vec!["/opt/agent-sandbox/agent-sandbox-helper".to_string()]
        );
        assert_eq!(body.cmd.unwrap(), vec!["idle".to_string()]);
    }

    #[test]
    fn without_a_network_the_helper_hosts_file_replaces_dockers_network_sandbox() {
        let hosts = "/var/lib/docker/volumes/helper-vol/_data/hosts";
        let mut p = plan();
        p.helper_volume = Some("helper-vol".into());
        let body = create_body(&p, Some(hosts)).unwrap();
        assert_eq!(body.network_disabled, Some(true));
        let hc = body.host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.binds, Some(vec![]));
        let mounts = hc.mounts.unwrap();
        let bound: Vec<_> = mounts
            .iter()
            .filter(|m| m.typ == Some(MountType::BIND))
            .collect();
        assert_eq!(bound.len(), 1, "{mounts:?}");
        assert_eq!(bound[0].source.as_deref(), Some(hosts));
        assert_eq!(bound[0].target.as_deref(), Some("/etc/hosts"));
        assert_eq!(bound[0].read_only, Some(true));

        // On the bridge Docker's own network sandbox provides /etc/hosts: no bind.
        p.network = Some("agent-sandbox-net".into());
        let body = create_body(&p, Some(hosts)).unwrap();
        assert_eq!(body.network_disabled, Some(false));
        let mounts = body.host_config.unwrap().mounts.unwrap();
        assert!(mounts.iter().all(|m| m.typ == Some(MountType::VOLUME)));
    }

    #[test]
    fn bad_values_are_refused() {
        let mut p = plan();
        p.env.insert("A=B".into(), "x".into());
        assert!(create_body(&p, None).is_err());
        let mut p = plan();
        p.cpus = f64::NAN;
        assert!(create_body(&p, None).is_err());
        let mut p = plan();
        p.memory_mb = u64::MAX;
        assert!(create_body(&p, None).is_err());
    }
}
