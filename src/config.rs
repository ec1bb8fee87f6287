//! Server settings: every `AGENT_SANDBOX_*` variable of the `/v1` contract plus our own (watched
//! folders, controller tuning), each also a `serve` flag. Parsing fails loudly: a bad value stops
//! the server with a message naming the variable, never a silent default.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::Args;

/// Settings for `agent-sandbox serve`. Flags override the environment.
#[derive(Args, Clone, Debug)]
pub struct Settings {
    /// API keys (comma-separated, each at least 16 characters). When none is set and auth is on,
    /// a key is generated on first start and kept in the data directory.
    #[arg(
        long = "api-key",
        env = "AGENT_SANDBOX_API_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Vec<String>,
    /// A YAML file of scoped API keys (`{name, sha256, namespaces, role}`, managed with
    /// `agent-sandbox keys`), reloaded when it changes. The keys above stay admin keys.
    #[arg(long, env = "AGENT_SANDBOX_KEYS_FILE")]
    pub keys_file: Option<PathBuf>,
    /// Turn authentication off entirely (only for local experiments).
    #[arg(long, env = "AGENT_SANDBOX_INSECURE_NO_AUTH", default_value = "false", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub insecure_no_auth: bool,
    /// Serve `GET /metrics` without an API key (for a Prometheus that cannot send one). The
    /// metrics hold resource names and usage, never a key or an environment value.
    #[arg(long, env = "AGENT_SANDBOX_METRICS_PUBLIC", default_value = "false", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub metrics_public: bool,
    #[arg(long, env = "AGENT_SANDBOX_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,
    #[arg(long, env = "AGENT_SANDBOX_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Data directory: manifests, state and snapshots.
    #[arg(long, env = "AGENT_SANDBOX_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
    /// Read-only folders of manifests to reconcile (repeatable; env: comma-separated). `NS=DIR`
    /// binds a folder to namespace NS: its documents that name none are in NS.
    #[arg(
        long = "watch",
        env = "AGENT_SANDBOX_WATCH_DIRS",
        value_delimiter = ','
    )]
    pub watch_dirs: Vec<crate::store::WatchDir>,
    #[arg(
        long,
        env = "AGENT_SANDBOX_DEFAULT_IMAGE",
        default_value = "python:3.12-slim"
    )]
    pub default_image: String,
    /// Image globs a sandbox may use (comma-separated).
    #[arg(
        long,
        env = "AGENT_SANDBOX_ALLOWED_IMAGES",
        value_delimiter = ',',
        default_value = "*"
    )]
    pub allowed_images: Vec<String>,
    /// When a sandbox that names no `imagePullPolicy` has its image pulled: `IfNotPresent`,
    /// `Always` or `Never`.
    #[arg(
        long,
        env = "AGENT_SANDBOX_IMAGE_PULL_POLICY",
        default_value = "IfNotPresent",
        value_parser = str::parse::<crate::resource::ImagePullPolicy>
    )]
    pub image_pull_policy: crate::resource::ImagePullPolicy,
    /// A Docker client config file (`auths`) with registry credentials for pulls; default: the
    /// one of the user the server runs as (`$DOCKER_CONFIG/config.json` or
    /// `~/.docker/config.json`).
    #[arg(long, env = "AGENT_SANDBOX_REGISTRY_AUTH_FILE")]
    pub registry_auth_file: Option<PathBuf>,
    /// `uid:gid` the sandbox's processes run as; never 0.
    #[arg(long, env = "AGENT_SANDBOX_SANDBOX_USER", default_value = "1000:1000")]
    pub sandbox_user: String,
    /// Docker runtime for sandboxes (empty for the daemon's default, or e.g. `runsc`).
    #[arg(long, env = "AGENT_SANDBOX_DOCKER_RUNTIME", default_value = "")]
    pub docker_runtime: String,
    #[arg(
        long,
        env = "AGENT_SANDBOX_NETWORK_NAME",
        default_value = "agent-sandbox-net"
    )]
    pub network_name: String,
    #[arg(long, env = "AGENT_SANDBOX_ALLOW_NETWORK", default_value = "true", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub allow_network: bool,
    #[arg(long, env = "AGENT_SANDBOX_MAX_SANDBOXES", default_value_t = 20)]
    pub max_sandboxes: usize,
    #[arg(
        long,
        env = "AGENT_SANDBOX_DEFAULT_TIMEOUT_SECONDS",
        default_value_t = 900
    )]
    pub default_timeout_seconds: u64,
    #[arg(
        long,
        env = "AGENT_SANDBOX_MAX_TIMEOUT_SECONDS",
        default_value_t = 86400
    )]
    pub max_timeout_seconds: u64,
    #[arg(long, env = "AGENT_SANDBOX_DEFAULT_CPUS", default_value_t = 1.0)]
    pub default_cpus: f64,
    #[arg(long, env = "AGENT_SANDBOX_MAX_CPUS", default_value_t = 4.0)]
    pub max_cpus: f64,
    #[arg(long, env = "AGENT_SANDBOX_DEFAULT_MEMORY_MB", default_value_t = 512)]
    pub default_memory_mb: u64,
    #[arg(long, env = "AGENT_SANDBOX_MAX_MEMORY_MB", default_value_t = 4096)]
    pub max_memory_mb: u64,
    #[arg(long, env = "AGENT_SANDBOX_DEFAULT_PIDS_LIMIT", default_value_t = 256)]
    pub default_pids_limit: u64,
    #[arg(long, env = "AGENT_SANDBOX_MAX_PIDS_LIMIT", default_value_t = 4096)]
    pub max_pids_limit: u64,
    /// `spec.diskMB` of sandboxes that set none: the size limit of `/workspace` in MiB; 0 is
    /// no limit.
    #[arg(long, env = "AGENT_SANDBOX_DEFAULT_DISK_MB", default_value_t = 0)]
    pub default_disk_mb: u64,
    /// The size in MiB of the (sparse) file system made for each workspace with a `diskMB`:
    /// a limit can be raised live up to it; beyond it the file system is grown online, which
    /// the kernel allows only with CAP_SYS_RESOURCE.
    #[arg(long, env = "AGENT_SANDBOX_DISK_IMAGE_MB", default_value_t = 65536)]
    pub disk_image_mb: u64,
    #[arg(long, env = "AGENT_SANDBOX_TMP_SIZE_MB", default_value_t = 256)]
    pub tmp_size_mb: u64,
    #[arg(
        long,
        env = "AGENT_SANDBOX_DEFAULT_EXEC_TIMEOUT_SECONDS",
        default_value_t = 60.0
    )]
    pub default_exec_timeout_seconds: f64,
    #[arg(
        long,
        env = "AGENT_SANDBOX_MAX_EXEC_TIMEOUT_SECONDS",
        default_value_t = 3600.0
    )]
    pub max_exec_timeout_seconds: f64,
    #[arg(
        long,
        env = "AGENT_SANDBOX_MAX_EXEC_OUTPUT_BYTES",
        default_value_t = 10_485_760
    )]
    pub max_exec_output_bytes: usize,
    #[arg(
        long,
        env = "AGENT_SANDBOX_MAX_FILE_BYTES",
        default_value_t = 52_428_800
    )]
    pub max_file_bytes: u64,
    /// Bytes of each output stream of each long-lived process that the sandbox retains for
    /// replay (held in the sandbox's memory, never in its `/tmp` or `/workspace`).
    #[arg(
        long,
        env = "AGENT_SANDBOX_PROCESS_OUTPUT_BYTES",
        default_value_t = 8_388_608
    )]
    pub process_output_bytes: u64,
    /// Long-lived processes running at once in one sandbox.
    #[arg(long, env = "AGENT_SANDBOX_MAX_PROCESSES", default_value_t = 64)]
    pub max_processes: u32,
    #[arg(
        long,
        env = "AGENT_SANDBOX_MAX_SNAPSHOT_BYTES",
        default_value_t = 1_073_741_824
    )]
    pub max_snapshot_bytes: u64,
    /// How often expiry is checked, in seconds.
    #[arg(
        long,
        env = "AGENT_SANDBOX_REAP_INTERVAL_SECONDS",
        default_value_t = 10.0
    )]
    pub reap_interval_seconds: f64,
    /// How long a webhook delivery is retried, in seconds, before it is given up (with an event
    /// saying so).
    #[arg(
        long,
        env = "AGENT_SANDBOX_WEBHOOK_RETRY_SECONDS",
        default_value_t = 86400.0
    )]
    pub webhook_retry_seconds: f64,
    /// The longest wait between two attempts of a webhook delivery, in seconds (the waits double
    /// from one second up to it).
    #[arg(
        long,
        env = "AGENT_SANDBOX_WEBHOOK_MAX_BACKOFF_SECONDS",
        default_value_t = 300.0
    )]
    pub webhook_max_backoff_seconds: f64,
    /// How often every resource is reconciled even without a trigger, in seconds.
    #[arg(long, env = "AGENT_SANDBOX_RESYNC_SECONDS", default_value_t = 300.0)]
    pub resync_seconds: f64,
    /// Read and write workspace volumes directly on this host when their directory is verifiably
    /// the sandbox's (faster snapshots, restores and creates); `false` always goes through
    /// Docker's archive API.
    #[arg(long, env = "AGENT_SANDBOX_HOST_WORKSPACE_ACCESS", default_value = "true", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub host_workspace_access: bool,
    /// Restore snapshots as copy-on-write views (an overlay of the snapshot's tree, unpacked once
    /// in the data directory) where the daemon is on this host and mounts them (needs
    /// `host_workspace_access` and root); `false` copies every restore's content.
    #[arg(long, env = "AGENT_SANDBOX_COPY_ON_WRITE", default_value = "true", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub copy_on_write: bool,
    /// Reach a runc sandbox's ports (proxy, previews, port-forward) by connecting from this host
    /// inside its network namespace (needs root with CAP_SYS_ADMIN and a daemon on this host);
    /// `false`, or where that is not possible (gVisor, a remote daemon), every connection is
    /// relayed by the in-sandbox helper over a `docker exec`.
    #[arg(long, env = "AGENT_SANDBOX_DIRECT_PORTS", default_value = "true", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub direct_ports: bool,
    /// Preview hosts: requests with `Host: {port}-{name}.{domain}` go to that sandbox's port
    /// (with the API key or a preview token). Unset: no preview hosts.
    #[arg(long, env = "AGENT_SANDBOX_PREVIEW_DOMAIN")]
    pub preview_domain: Option<String>,
    /// The allow list (entries as in `spec.egress.allow`, comma-separated) of sandboxes with a
    /// network that set no `egress` of their own. Empty: such sandboxes keep the open network.
    #[arg(
        long = "egress-default",
        env = "AGENT_SANDBOX_EGRESS_DEFAULT",
        value_delimiter = ','
    )]
    pub egress_default: Vec<String>,
    /// Refuse link-local destinations (cloud metadata) and the host's own addresses to sandboxes
    /// on the open network (`network: true` without `egress`), with `iptables` rules on this
    /// host. Turn off only where they cannot be applied (a Docker daemon on another host).
    #[arg(long, env = "AGENT_SANDBOX_OPEN_NETWORK_GUARD", default_value = "true", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub open_network_guard: bool,
    /// Refuse sandboxes with an open network: every sandbox with `network: true` must set
    /// `egress` (or get `AGENT_SANDBOX_EGRESS_DEFAULT`).
    #[arg(long, env = "AGENT_SANDBOX_EGRESS_REQUIRED", default_value = "false", value_parser = BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub egress_required: bool,
    /// Address blocks (comma-separated CIDRs) that egress may reach although they are private,
    /// link-local or loopback.
    #[arg(
        long = "egress-private-allow",
        env = "AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW",
        value_delimiter = ','
    )]
    pub egress_private_allow: Vec<String>,
    /// A hosts-format file the egress gateway consults before the host's resolver.
    #[arg(long = "egress-hosts", env = "AGENT_SANDBOX_EGRESS_HOSTS")]
    pub egress_hosts: Option<PathBuf>,
    /// A PEM file of certificates the egress gateway trusts for upstream TLS, besides the host's
    /// roots (when it opens HTTPS to a Secret's host).
    #[arg(long = "egress-extra-ca", env = "AGENT_SANDBOX_EGRESS_EXTRA_CA")]
    pub egress_extra_ca: Option<PathBuf>,
    /// How many reconciles may run at once. Reconciles mostly wait on Docker and the disk; 16
    /// lets the children of a `Fork` of up to 15 replicas claim warm members all at once.
    #[arg(long, env = "AGENT_SANDBOX_RECONCILE_WORKERS", default_value_t = 16)]
    pub reconcile_workers: usize,
}

/// A setting that cannot be used, with the variable to blame.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting {variable}: {message}")]
pub struct SettingsError {
    pub variable: &'static str,
    pub message: String,
}

fn invalid(variable: &'static str, message: impl Into<String>) -> SettingsError {
    SettingsError {
        variable,
        message: message.into(),
    }
}

impl Settings {
    /// Checks what clap cannot: ranges and relations between settings.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if let Some(short) = self.api_keys.iter().find(|k| k.trim().len() < 16) {
            let _ = short;
            return Err(invalid(
                "AGENT_SANDBOX_API_KEYS",
                "every key must be at least 16 characters",
            ));
        }
        let (uid, gid) = self.sandbox_uid_gid()?;
        if uid == 0 || gid == 0 {
            return Err(invalid(
                "AGENT_SANDBOX_SANDBOX_USER",
                "sandboxes never run as root (uid or gid 0)",
            ));
        }
        if self.process_output_bytes < 4096 || self.process_output_bytes > 1 << 32 {
            return Err(invalid(
                "AGENT_SANDBOX_PROCESS_OUTPUT_BYTES",
                "must be at least 4096 and at most 4 GiB",
            ));
        }
        if let Some(domain) = &self.preview_domain {
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            };
            if domain.is_empty() || !domain.split('.').all(label_ok) {
                return Err(invalid(
                    "AGENT_SANDBOX_PREVIEW_DOMAIN",
                    "must be a lowercase DNS name such as preview.localhost",
                ));
            }
        }
        if self.max_processes == 0 {
            return Err(invalid("AGENT_SANDBOX_MAX_PROCESSES", "must be at least 1"));
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.default_cpus)
            || !positive(self.max_cpus)
            || self.default_cpus > self.max_cpus
        {
            return Err(invalid(
                "AGENT_SANDBOX_DEFAULT_CPUS",
                "cpus must be > 0 and the default at most AGENT_SANDBOX_MAX_CPUS",
            ));
        }
        if self.default_memory_mb < 16 || self.default_memory_mb > self.max_memory_mb {
            return Err(invalid(
                "AGENT_SANDBOX_DEFAULT_MEMORY_MB",
                "must be at least 16 and at most AGENT_SANDBOX_MAX_MEMORY_MB",
            ));
        }
        if self.default_pids_limit < 8 || self.default_pids_limit > self.max_pids_limit {
            return Err(invalid(
                "AGENT_SANDBOX_DEFAULT_PIDS_LIMIT",
                "must be at least 8 and at most AGENT_SANDBOX_MAX_PIDS_LIMIT",
            ));
        }
        if self.default_timeout_seconds == 0
            || self.default_timeout_seconds > self.max_timeout_seconds
        {
            return Err(invalid(
                "AGENT_SANDBOX_DEFAULT_TIMEOUT_SECONDS",
                "must be at least 1 and at most AGENT_SANDBOX_MAX_TIMEOUT_SECONDS",
            ));
        }
        if !positive(self.default_exec_timeout_seconds)
            || self.default_exec_timeout_seconds > self.max_exec_timeout_seconds
        {
            return Err(invalid(
                "AGENT_SANDBOX_DEFAULT_EXEC_TIMEOUT_SECONDS",
                "must be > 0 and at most AGENT_SANDBOX_MAX_EXEC_TIMEOUT_SECONDS",
            ));
        }
        if !positive(self.reap_interval_seconds) {
            return Err(invalid(
                "AGENT_SANDBOX_REAP_INTERVAL_SECONDS",
                "must be > 0",
            ));
        }
        if !positive(self.webhook_retry_seconds) {
            return Err(invalid(
                "AGENT_SANDBOX_WEBHOOK_RETRY_SECONDS",
                "must be > 0",
            ));
        }
        if !positive(self.webhook_max_backoff_seconds) {
            return Err(invalid(
                "AGENT_SANDBOX_WEBHOOK_MAX_BACKOFF_SECONDS",
                "must be > 0",
            ));
        }
        if !positive(self.resync_seconds) {
            return Err(invalid("AGENT_SANDBOX_RESYNC_SECONDS", "must be > 0"));
        }
        if self.reconcile_workers == 0 {
            return Err(invalid(
                "AGENT_SANDBOX_RECONCILE_WORKERS",
                "must be at least 1",
            ));
        }
        if self.tmp_size_mb == 0 {
            return Err(invalid("AGENT_SANDBOX_TMP_SIZE_MB", "must be at least 1"));
        }
        for pattern in &self.allowed_images {
            glob::Pattern::new(pattern).map_err(|e| {
                invalid("AGENT_SANDBOX_ALLOWED_IMAGES", format!("{pattern:?}: {e}"))
            })?;
        }
        if let Err(error) = crate::resource::parse_allow_list(&self.egress_default) {
            return Err(invalid(
                "AGENT_SANDBOX_EGRESS_DEFAULT",
                format!("entry {} {:?}: {}", error.index, error.entry, error.reason),
            ));
        }
        self.egress_private_allow()?;
        if self.network_name.is_empty() {
            return Err(invalid("AGENT_SANDBOX_NETWORK_NAME", "must not be empty"));
        }
        Ok(())
    }

    /// `AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW` parsed.
    pub fn egress_private_allow(&self) -> Result<Vec<crate::resource::Cidr>, SettingsError> {
        self.egress_private_allow
            .iter()
            .map(|text| {
                text.trim().parse().map_err(|reason| {
                    invalid(
                        "AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW",
                        format!("{text:?}: {reason}"),
                    )
                })
            })
            .collect()
    }

    /// Whether sandboxes with a network that set no `egress` get the default list.
    pub fn egress_by_default(&self) -> bool {
        !self.egress_default.is_empty()
    }

    /// What a sandbox that leaves a property out gets.
    pub fn sandbox_defaults(&self) -> crate::resource::SandboxDefaults {
        crate::resource::SandboxDefaults {
            image: self.default_image.clone(),
            cpus: self.default_cpus,
            memory_mb: self.default_memory_mb,
            pids_limit: self.default_pids_limit,
            disk_mb: self.default_disk_mb,
            egress_by_default: self.egress_by_default(),
        }
    }

    /// The Docker network of sandboxes whose egress goes through the gateway: created
    /// `--internal`, so it has no route out of the host.
    pub fn egress_network_name(&self) -> String {
        format!("{}-egress", self.network_name)
    }

    pub fn sandbox_uid_gid(&self) -> Result<(u32, u32), SettingsError> {
        let bad = || {
            invalid(
                "AGENT_SANDBOX_SANDBOX_USER",
                "expected uid:gid, e.g. 1000:1000",
            )
        };
        let (uid, gid) = self.sandbox_user.split_once(':').ok_or_else(bad)?;
        Ok((
            uid.parse().map_err(|_| bad())?,
            gid.parse().map_err(|_| bad())?,
        ))
    }

    /// Whether `image` matches one of the allowlist's globs.
    pub fn image_allowed(&self, image: &str) -> bool {
        self.allowed_images.iter().any(|p| {
            glob::Pattern::new(p.trim())
                .map(|pattern| pattern.matches(image))
                .unwrap_or(false)
        })
    }

    pub fn reap_interval(&self) -> Duration {
        Duration::from_secs_f64(self.reap_interval_seconds)
    }

    pub fn resync_interval(&self) -> Duration {
        Duration::from_secs_f64(self.resync_seconds)
    }

    /// Settings for tests and tools: the defaults, with `data_dir` set.
    pub fn for_tests(data_dir: PathBuf) -> Settings {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            settings: Settings,
        }
        let mut settings = <Wrapper as clap::Parser>::parse_from(["agent-sandbox"]).settings;
        settings.data_dir = data_dir;
        settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_contract() {
        let s = Settings::for_tests(PathBuf::from("/tmp/x"));
        s.validate().unwrap();
        assert_eq!(s.port, 8080);
        assert_eq!(s.max_sandboxes, 20);
        assert_eq!(s.max_exec_output_bytes, 10_485_760);
        assert!(s.image_allowed("anything:tag"));
    }

    #[test]
    fn refuses_root_and_short_keys() {
        let mut s = Settings::for_tests(PathBuf::from("/tmp/x"));
        s.sandbox_user = "0:0".into();
        assert_eq!(
            s.validate().unwrap_err().variable,
            "AGENT_SANDBOX_SANDBOX_USER"
        );
        let mut s = Settings::for_tests(PathBuf::from("/tmp/x"));
        s.api_keys = vec!["short".into()];
        assert_eq!(s.validate().unwrap_err().variable, "AGENT_SANDBOX_API_KEYS");
    }

    #[test]
    fn egress_settings_are_checked_and_name_their_variable() {
        let mut s = Settings::for_tests(PathBuf::from("/tmp/x"));
        assert!(!s.egress_by_default());
        s.egress_default = vec!["pypi.org".into(), "*.com".into()];
        let error = s.validate().unwrap_err();
        assert_eq!(error.variable, "AGENT_SANDBOX_EGRESS_DEFAULT");
        assert!(error.message.contains("entry 1 \"*.com\""), "{error}");
        s.egress_default = vec!["pypi.org".into()];
        s.validate().unwrap();
        assert!(s.egress_by_default());
        s.egress_private_allow = vec!["10.0.0.0/8".into(), "10.1.2.3/8".into()];
        let error = s.validate().unwrap_err();
        assert_eq!(error.variable, "AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW");
        assert!(error.message.contains("10.1.2.3/8"), "{error}");
        s.egress_private_allow = vec!["10.0.0.0/8".into()];
        assert_eq!(s.egress_private_allow().unwrap().len(), 1);
    }

    #[test]
    fn image_globs() {
        let mut s = Settings::for_tests(PathBuf::from("/tmp/x"));
        s.allowed_images = vec!["python:*".into(), "agent-sandbox-test/*".into()];
        assert!(s.image_allowed("python:3.12-slim"));
        assert!(s.image_allowed("agent-sandbox-test/busybox:latest"));
        assert!(!s.image_allowed("ubuntu:24.04"));
    }
}
