//! The start-up checks: what `agent-sandbox doctor` prints and what `serve` logs when it starts.
//! Each check looks at one thing a first run trips over — Docker and its release, the runtime,
//! the default image, the data directory, the key file, the port, how workspaces are reached, the
//! open network's firewall guard —
//! and says in one line what it found and, when something is wrong, the fix.
//!
//! Checks only look. The one thing `doctor` starts is a short-lived, labeled container that proves
//! the configured runtime runs a hardened container (see `docker::BollardEngine::try_runtime`);
//! `serve` skips it, as its first sandbox proves the same.
//! Docker is reached only through the `docker` module and the data directory only through
//! `store::inspect`.

use std::fmt;
use std::net::SocketAddr;

use crate::api::auth::KEY_FILE;
use crate::config::Settings;
use crate::docker::{BollardEngine, DaemonReport, Engine};
use crate::store::inspect;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// Works, but there is something to know.
    Warn,
    /// Will not work until fixed.
    Fail,
}

/// One check's one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub verdict: Verdict,
    /// What was checked, a short word: `docker`, `runtime`, `image`, ...
    pub check: &'static str,
    pub message: String,
    /// What to do about it, for warnings and failures.
    pub fix: Option<String>,
}

impl Finding {
    fn ok(check: &'static str, message: impl Into<String>) -> Finding {
        Finding {
            verdict: Verdict::Ok,
            check,
            message: message.into(),
            fix: None,
        }
    }

    fn warn(check: &'static str, message: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            verdict: Verdict::Warn,
            check,
            message: message.into(),
            fix: Some(fix.into()),
        }
    }

    fn fail(check: &'static str, message: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            verdict: Verdict::Fail,
            check,
            message: message.into(),
            fix: Some(fix.into()),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match self.verdict {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
        };
        write!(f, "{verdict:<5} {:<10} {}", self.check, self.message)?;
        if let Some(fix) = &self.fix {
            write!(f, " — fix: {fix}")?;
        }
        Ok(())
    }
}

/// Which checks to run: `serve` skips the port (its own bind says it) and proves the runtime
/// with its first sandbox instead of a trial container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Occasion {
    /// `agent-sandbox doctor`: everything.
    Doctor,
    /// `serve`, once it listens.
    Serve,
}

/// Runs every check against these settings and the daemon, in the order a person fixes things.
pub async fn run(settings: &Settings, occasion: Occasion) -> Vec<Finding> {
    let mut findings = vec![data_dir(settings), key_file(settings)];
    if occasion == Occasion::Doctor {
        findings.push(port(settings));
    }
    let engine = match BollardEngine::connect().await {
        Ok(engine) => engine,
        Err(e) => {
            findings.push(Finding::fail(
                "docker",
                format!("cannot reach Docker: {e}"),
                "start the daemon (`systemctl start docker`), or point DOCKER_HOST at it; the \
                 server's user must be allowed to use its socket (root, or the `docker` group)",
            ));
            return findings;
        }
    };
    let report = match engine.daemon_report().await {
        Ok(report) => report,
        Err(e) => {
            findings.push(Finding::fail(
                "docker",
                format!("Docker does not answer: {e}"),
                "restart the daemon (`systemctl restart docker`)",
            ));
            return findings;
        }
    };
    findings.push(Finding::ok(
        "docker",
        format!(
            "Docker {} at {}, API {} (negotiated)",
            report.server_version, report.endpoint, report.api_version
        ),
    ));
    findings.extend(known_problems(&report.server_version));
    findings.push(runtime(&engine, settings, &report, occasion).await);
    findings.extend(gvisor_platform(settings, &report));
    findings.push(image(&engine, settings).await);
    findings.push(workspace_access(settings, &report));
    findings.push(open_network_guard(settings, &report).await);
    findings
}

/// Whether open-network sandboxes can get their firewall guard (they do not start without it).
async fn open_network_guard(settings: &Settings, report: &DaemonReport) -> Finding {
    const CHECK: &str = "network";
    const OFF: &str = "or set AGENT_SANDBOX_OPEN_NETWORK_GUARD=false and guard the daemon's host \
                       yourself (SECURITY.md)";
    if !settings.open_network_guard {
        return Finding::warn(
            CHECK,
            "the guard is off: open sandboxes (network: true, no egress) reach link-local \
             (cloud metadata) and this host's addresses",
            "set AGENT_SANDBOX_OPEN_NETWORK_GUARD=true where the daemon runs on this host",
        );
    }
    if !report.endpoint.starts_with("unix://") {
        return Finding::warn(
            CHECK,
            format!(
                "Docker is at {}: the guard's iptables rules would be put on this host, not the \
                 daemon's",
                report.endpoint
            ),
            format!("run the server on the daemon's host, {OFF}"),
        );
    }
    match crate::firewall::check().await {
        Ok(()) => Finding::ok(
            CHECK,
            "iptables can refuse link-local and host addresses to open sandboxes",
        ),
        Err(error) => Finding::fail(
            CHECK,
            format!("open sandboxes will not start without their guard: {error}"),
            format!(
                "run the server as root where `iptables` and Docker's DOCKER-USER chain are, {OFF}"
            ),
        ),
    }
}

/// Warnings about how gVisor is registered, when it is the server's runtime: without its systrap
/// platform (under ptrace, the default of releases before 2023 such as Debian bookworm's, gVisor's
/// host threads grow with every process storm until the container's pids bound kills the whole
/// gVisor sandbox: SECURITY.md), and, on a release that has systrap, with its own root overlay
/// left on (its default from 2023: writes outside the volumes then live in gVisor's memory file
/// store, lost when a sandbox stops and invisible to Docker).
fn gvisor_platform(settings: &Settings, report: &DaemonReport) -> Vec<Finding> {
    let name = settings.docker_runtime.trim();
    let name = if name.is_empty() {
        report.default_runtime.as_str()
    } else {
        name
    };
    if !crate::docker::is_gvisor(name) {
        return Vec::new();
    }
    let Some(args) = report.runtime_args.get(name) else {
        return Vec::new();
    };
    let fix = "register it with `scripts/install-runsc.sh` from the source tree (a gVisor \
               release with `--platform=systrap`, and `--overlay2=none`)";
    let platform = gvisor_arg(args, "platform");
    if platform != Some("systrap") {
        let said = match platform {
            Some(p) => format!("runs gVisor's {p} platform"),
            None => "names no platform (releases before 2023 default to ptrace)".to_string(),
        };
        return vec![Finding::warn(
            "runtime",
            format!("runtime {name:?} {said}: process storms can restart its sandboxes"),
            fix,
        )];
    }
    if gvisor_arg(args, "overlay2") != Some("none") {
        return vec![Finding::warn(
            "runtime",
            format!(
                "runtime {name:?} keeps gVisor's own root overlay: what a sandbox installs \
                 outside its workspace is lost when it stops"
            ),
            fix,
        )];
    }
    Vec::new()
}

/// The value of `--NAME=V` (or `-NAME V`) in a runtime's arguments.
fn gvisor_arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let flag = arg.trim_start_matches('-');
        if let Some(value) = flag.strip_prefix(name).and_then(|v| v.strip_prefix('=')) {
            return Some(value);
        }
        if flag == name && arg.starts_with('-') {
            return it.next().map(String::as_str);
        }
    }
    None
}

/// The data directory: exists and is this user's, or can be created.
fn data_dir(settings: &Settings) -> Finding {
    let dir = &settings.data_dir;
    let shown = dir.display();
    let euid = inspect::effective_uid();
    match inspect::inspect(dir) {
        Err(e) => Finding::fail(
            "data",
            format!("cannot look at the data directory {shown}: {e}"),
            "make it readable by the server's user, or set AGENT_SANDBOX_DATA_DIR",
        ),
        Ok(None) => match inspect::nearest_existing(dir) {
            Some((parent, entry)) if entry.is_dir && entry.writable => Finding::ok(
                "data",
                format!(
                    "data directory {shown} does not exist yet; it will be created in {}",
                    parent.display()
                ),
            ),
            Some((parent, _)) => Finding::fail(
                "data",
                format!(
                    "data directory {shown} cannot be created: {} is not writable by uid {euid}",
                    parent.display()
                ),
                format!(
                    "create it for this user (`mkdir -p {shown}`), or set AGENT_SANDBOX_DATA_DIR"
                ),
            ),
            None => Finding::fail(
                "data",
                format!("data directory {shown} has no existing parent"),
                "set AGENT_SANDBOX_DATA_DIR to a directory this user can write",
            ),
        },
        Ok(Some(entry)) if !entry.is_dir => Finding::fail(
            "data",
            format!("{shown} is not a directory"),
            "remove it, or set AGENT_SANDBOX_DATA_DIR to a directory",
        ),
        Ok(Some(entry)) if !entry.writable => Finding::fail(
            "data",
            format!(
                "data directory {shown} (owner uid {}, mode {:04o}) is not writable by uid {euid}",
                entry.owner_uid, entry.mode
            ),
            format!("`chown -R {euid} {shown}`, or run the server as its owner"),
        ),
        Ok(Some(entry)) if entry.owner_uid != euid => Finding::warn(
            "data",
            format!(
                "data directory {shown} belongs to uid {}, not to the server's uid {euid}",
                entry.owner_uid
            ),
            format!(
                "`chown -R {euid} {shown}`: snapshots and the key file should be the server's own"
            ),
        ),
        Ok(Some(entry)) if entry.mode & 0o002 != 0 => Finding::warn(
            "data",
            format!(
                "data directory {shown} is writable by everyone (mode {:04o})",
                entry.mode
            ),
            format!("`chmod o-w {shown}`: anyone could then change desired state"),
        ),
        Ok(Some(entry)) => Finding::ok(
            "data",
            format!(
                "data directory {shown} (owner uid {}, mode {:04o})",
                entry.owner_uid, entry.mode
            ),
        ),
    }
}

/// Where the API key comes from, and that a generated one is private.
fn key_file(settings: &Settings) -> Finding {
    if settings.insecure_no_auth {
        return Finding::warn(
            "key",
            "authentication is off (AGENT_SANDBOX_INSECURE_NO_AUTH=true): anyone who reaches \
             the port runs code in the sandboxes",
            "unset AGENT_SANDBOX_INSECURE_NO_AUTH unless this is a throw-away experiment",
        );
    }
    let configured = settings
        .api_keys
        .iter()
        .filter(|k| !k.trim().is_empty())
        .count();
    if configured > 0 {
        return Finding::ok(
            "key",
            format!("{configured} API key(s) from AGENT_SANDBOX_API_KEYS"),
        );
    }
    let path = settings.data_dir.join(KEY_FILE);
    let shown = path.display();
    match inspect::inspect(&path) {
        Ok(None) => Finding::ok(
            "key",
            format!("no key configured: one will be generated into {shown} (mode 0600)"),
        ),
        Ok(Some(entry)) if entry.mode & 0o077 != 0 => Finding::fail(
            "key",
            format!(
                "key file {shown} is readable by others (mode {:04o})",
                entry.mode
            ),
            format!("`chmod 600 {shown}` (the server refuses a key others can read)"),
        ),
        Ok(Some(entry)) if entry.owner_uid != inspect::effective_uid() => Finding::fail(
            "key",
            format!("key file {shown} belongs to uid {}", entry.owner_uid),
            format!(
                "`chown {} {shown}`, or run the server as its owner",
                inspect::effective_uid()
            ),
        ),
        Ok(Some(_)) => Finding::ok("key", format!("API key in {shown} (mode 0600)")),
        Err(e) => Finding::fail(
            "key",
            format!("cannot look at {shown}: {e}"),
            "make the data directory readable by the server's user",
        ),
    }
}

/// Whether the listen address is free.
fn port(settings: &Settings) -> Finding {
    let address = SocketAddr::new(settings.host, settings.port);
    match std::net::TcpListener::bind(address) {
        Ok(_) => Finding::ok("port", format!("{address} is free")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Finding::fail(
            "port",
            format!("{address} is already in use (another server, or this one already running?)"),
            "stop what listens there, or set AGENT_SANDBOX_PORT (and AGENT_SANDBOX_HOST)",
        ),
        Err(e) => Finding::fail(
            "port",
            format!("cannot listen on {address}: {e}"),
            "choose another AGENT_SANDBOX_HOST / AGENT_SANDBOX_PORT",
        ),
    }
}

/// Releases of Docker with problems the server works around or cannot.
fn known_problems(server_version: &str) -> Option<Finding> {
    let mut parts = server_version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    let (major, minor, patch) = (parts.next()??, parts.next()??, parts.next()??);
    if (major, minor) < (20, 10) {
        return Some(Finding::fail(
            "docker",
            format!("Docker {server_version} is older than 20.10 (API 1.41), the oldest supported"),
            "upgrade Docker",
        ));
    }
    if (major, minor) == (20, 10) && patch < 27 {
        return Some(Finding::warn(
            "docker",
            format!(
                "Docker {server_version} can deadlock when many containers leave their \
                 networks at once (moby/moby#46661); the server removes containers one at a time \
                 to stay clear of it"
            ),
            "upgrade to 20.10.27 or later; if the daemon hangs anyway, restart it and the server \
             converges by itself",
        ));
    }
    None
}

/// The configured runtime is registered and starts a hardened container.
async fn runtime(
    engine: &BollardEngine,
    settings: &Settings,
    report: &DaemonReport,
    occasion: Occasion,
) -> Finding {
    let configured = settings.docker_runtime.trim();
    let name = if configured.is_empty() {
        report.default_runtime.as_str()
    } else {
        configured
    };
    if !report.runtimes.iter().any(|r| r == name) {
        let fix = if crate::docker::is_gvisor(name) {
            "install gVisor (Debian's `runsc` package) and register it with the daemon \
             (`scripts/install-runsc.sh` in the source tree does both), or unset \
             AGENT_SANDBOX_DOCKER_RUNTIME"
                .to_string()
        } else {
            format!(
                "register {name:?} under \"runtimes\" in /etc/docker/daemon.json and reload \
                 the daemon, or set AGENT_SANDBOX_DOCKER_RUNTIME to one of: {}",
                report.runtimes.join(", ")
            )
        };
        return Finding::fail(
            "runtime",
            format!(
                "runtime {name:?} is not registered with Docker (it has: {})",
                report.runtimes.join(", ")
            ),
            fix,
        );
    }
    let Some(binary) = crate::helper_binary::helper_binary() else {
        return Finding::warn(
            "runtime",
            format!("runtime {name:?} is registered (not tried: this build has no helper)"),
            "build with the helper (`AGENT_SANDBOX_REQUIRE_HELPER=1 cargo build`) for fast exec",
        );
    };
    if occasion == Occasion::Serve {
        // The server's first sandbox proves the runtime; a trial container beside every start
        // would only add Docker work (and a container a killed start leaves behind).
        return Finding::ok("runtime", format!("runtime {name:?} is registered"));
    }
    let volume = crate::docker::helper_volume_name(binary);
    let tried = match fill_helper_volume(engine, &volume, binary).await {
        Ok(()) => {
            engine
                .try_runtime(configured, &volume, &settings.sandbox_user)
                .await
        }
        Err(e) => Err(e),
    };
    match tried {
        Ok(took) => Finding::ok(
            "runtime",
            format!(
                "runtime {name:?} starts a hardened container ({} ms)",
                took.as_millis()
            ),
        ),
        Err(e) => Finding::fail(
            "runtime",
            format!("runtime {name:?} is registered but cannot run a container: {e}"),
            if crate::docker::is_gvisor(name) {
                "gVisor needs `--network=host` or `--network=none` in its runtimeArgs here \
                 (`scripts/install-runsc.sh` registers it so); see the daemon's log"
            } else {
                "see the daemon's log (`journalctl -u docker`)"
            },
        ),
    }
}

/// Fills the helper volume, waiting out another process that is filling it (or a filler a killed
/// process left, which the engine removes once it is stale).
async fn fill_helper_volume(
    engine: &BollardEngine,
    volume: &str,
    binary: &[u8],
) -> Result<(), crate::docker::EngineError> {
    let mut attempts = 0;
    loop {
        match engine.ensure_helper_volume(volume, binary).await {
            Err(crate::docker::EngineError::Conflict { .. }) if attempts < 3 => attempts += 1,
            other => return other,
        }
    }
}

/// The default image is on the daemon (nothing is pulled).
async fn image(engine: &BollardEngine, settings: &Settings) -> Finding {
    let image = &settings.default_image;
    if !settings.image_allowed(image) {
        return Finding::fail(
            "image",
            format!("the default image {image} is not allowed by AGENT_SANDBOX_ALLOWED_IMAGES"),
            "add it to AGENT_SANDBOX_ALLOWED_IMAGES, or set AGENT_SANDBOX_DEFAULT_IMAGE",
        );
    }
    match engine.image_exists(image).await {
        Ok(true) => Finding::ok("image", format!("default image {image} is present")),
        Ok(false) => Finding::fail(
            "image",
            format!(
                "default image {image} is not on the Docker host, and the server pulls no \
                 image: a sandbox that names no image cannot start"
            ),
            format!(
                "`docker pull {image}` where a registry is reachable; or, offline, \
                 `bash scripts/build-test-images.sh` (in the source tree) and \
                 AGENT_SANDBOX_DEFAULT_IMAGE=agent-sandbox-test/busybox:latest; or set \
                 AGENT_SANDBOX_DEFAULT_IMAGE to an image you have (`docker images`)"
            ),
        ),
        Err(e) => Finding::fail(
            "image",
            format!("cannot look up {image}: {e}"),
            "see the daemon's log",
        ),
    }
}

/// Which path workspaces take: directly on this host, or Docker's archive API.
fn workspace_access(settings: &Settings, report: &DaemonReport) -> Finding {
    if !settings.host_workspace_access {
        return Finding::ok(
            "workspace",
            "workspaces go through Docker's archive API (AGENT_SANDBOX_HOST_WORKSPACE_ACCESS=false)",
        );
    }
    let remote = !report.endpoint.starts_with("unix://");
    let reason = if inspect::effective_uid() != 0 {
        Some("the server does not run as root".to_string())
    } else if remote {
        Some(format!("the daemon is remote ({})", report.endpoint))
    } else if !matches!(
        inspect::inspect(std::path::Path::new(&report.root_dir)),
        Ok(Some(_))
    ) {
        Some(format!(
            "the daemon's data root {} is not on this host",
            report.root_dir
        ))
    } else {
        None
    };
    match reason {
        None => Finding::ok(
            "workspace",
            format!(
                "workspaces are read and written on this host under {}/volumes, each proven to \
                 be the sandbox's before use (else Docker's archive API)",
                report.root_dir
            ),
        ),
        Some(reason) => Finding::ok(
            "workspace",
            format!(
                "workspaces go through Docker's archive API: {reason} (slower snapshots and \
                 restores; nothing to fix)"
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gvisor_platform_is_read_from_the_runtime_arguments() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let of = |a: &[&str]| gvisor_arg(&args(a), "platform").map(str::to_string);
        assert_eq!(
            of(&["--network=host", "--platform=systrap"]).as_deref(),
            Some("systrap")
        );
        assert_eq!(of(&["-platform", "ptrace"]).as_deref(), Some("ptrace"));
        assert_eq!(of(&["--network=host"]), None);
        assert_eq!(of(&["--platform_device_path=/dev/kvm"]), None);
        let overlay = args(&["--platform=systrap", "--overlay2=none"]);
        assert_eq!(gvisor_arg(&overlay, "overlay2"), Some("none"));
        assert_eq!(gvisor_arg(&overlay, "overlay"), None);
    }

    #[test]
    fn known_docker_problems() {
        let deadlock = known_problems("20.10.24+dfsg1").unwrap();
        assert_eq!(deadlock.verdict, Verdict::Warn);
        assert!(deadlock.message.contains("moby/moby#46661"));
        assert!(known_problems("20.10.27").is_none());
        assert!(known_problems("24.0.7").is_none());
        assert_eq!(known_problems("19.03.15").unwrap().verdict, Verdict::Fail);
        assert!(known_problems("unknown").is_none());
    }

    #[test]
    fn a_line_has_a_verdict_a_check_and_a_fix() {
        let line = Finding::fail("image", "missing", "build one").to_string();
        assert_eq!(line, "FAIL  image      missing — fix: build one");
        assert_eq!(
            Finding::ok("port", "free").to_string(),
            "ok    port       free"
        );
    }

    #[test]
    fn the_key_file_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings::for_tests(dir.path().to_path_buf());
        assert_eq!(key_file(&settings).verdict, Verdict::Ok);
        let path = dir.path().join(KEY_FILE);
        std::fs::write(&path, "k").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let finding = key_file(&settings);
        assert_eq!(finding.verdict, Verdict::Fail);
        assert!(finding.fix.unwrap().contains("chmod 600"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(key_file(&settings).verdict, Verdict::Ok);
    }

    #[test]
    fn a_busy_port_fails() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut settings = Settings::for_tests(std::path::PathBuf::from("/tmp/x"));
        settings.host = "127.0.0.1".parse().unwrap();
        settings.port = taken.local_addr().unwrap().port();
        let finding = port(&settings);
        assert_eq!(finding.verdict, Verdict::Fail);
        assert!(finding.message.contains("already in use"));
        drop(taken);
        assert_eq!(port(&settings).verdict, Verdict::Ok);
    }

    #[test]
    fn a_data_directory_that_does_not_exist_yet_is_fine_where_it_can_be_made() {
        let dir = tempfile::tempdir().unwrap();
        let settings = Settings::for_tests(dir.path().join("data"));
        let finding = data_dir(&settings);
        assert_eq!(finding.verdict, Verdict::Ok, "{finding}");
        assert!(finding.message.contains("will be created"));
    }
}
