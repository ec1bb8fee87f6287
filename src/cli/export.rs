//! `export --to kubernetes`: prints the Kubernetes objects for manifests (read through
//! `manifests`, so through `resource::yaml`) or for what a running server holds (through the
//! resource API). Parsing, calling [`crate::export`] and printing only: the translation lives
//! there.

use std::path::PathBuf;
use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::{Args, ValueEnum};
use serde_json::Value;

use super::client::{Client, Connection};
use super::manifests;
use super::{emit, emit_err, CliError};
use crate::export::{self, ExportOptions};
use crate::resource::{yaml, AnyResource, Kind, SandboxDefaults};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Target {
    /// kubernetes-sigs/agent-sandbox objects (agents.x-k8s.io/v1beta1) and NetworkPolicies.
    Kubernetes,
}

#[derive(Args, Debug)]
#[command(
    after_help = "The output starts with a comment block listing everything that has no \
Kubernetes equivalent (left out) or is expressed differently. See docs/scale-out.md.

Examples:
  agent-sandbox export --to kubernetes -f examples/ | kubectl apply -f -
  agent-sandbox export --to kubernetes -f sandbox.yaml --strict --namespace agents
  agent-sandbox export --to kubernetes --from-server --docker-runtime runsc"
)]
pub struct ExportArgs {
    /// What to export to.
    #[arg(long = "to", value_enum)]
    pub to: Target,
    /// A manifest file, a folder (read recursively) or `-` for standard input. Repeatable.
    #[arg(
        short = 'f',
        long = "filename",
        value_name = "PATH",
        required_unless_present = "from_server",
        conflicts_with = "from_server"
    )]
    pub files: Vec<PathBuf>,
    /// Export every resource the server holds instead of manifests.
    #[arg(long)]
    pub from_server: bool,
    /// Exit 1, printing nothing but the reasons, when anything cannot be expressed.
    #[arg(long)]
    pub strict: bool,
    /// Count `ttlSeconds` from this instant (RFC 3339) instead of now.
    #[arg(long, value_name = "TIME")]
    pub start_time: Option<DateTime<Utc>>,
    /// RuntimeClass of the cluster that runs gVisor (used when the runtime is runsc).
    #[arg(long, default_value = "gvisor")]
    pub gvisor_runtime_class: String,
    /// Storage request of each workspace claim.
    #[arg(long, default_value = "1Gi")]
    pub workspace_size: String,
    /// StorageClass of the workspace claims (the cluster's default if unset).
    #[arg(long)]
    pub storage_class: Option<String>,
    #[command(flatten)]
    pub server_defaults: ServerDefaults,
    #[command(flatten)]
    pub connection: Connection,
}

/// The server settings that fill a spec's gaps, read from the same variables `serve` reads (and
/// with the same defaults), so that an export on the server's host matches what it runs.
#[derive(Args, Debug, Clone)]
pub struct ServerDefaults {
    #[arg(
        long,
        env = "AGENT_SANDBOX_DEFAULT_IMAGE",
        default_value = "python:3.12-slim"
    )]
    pub default_image: String,
    #[arg(long, env = "AGENT_SANDBOX_DEFAULT_CPUS", default_value_t = 1.0)]
    pub default_cpus: f64,
    #[arg(long, env = "AGENT_SANDBOX_DEFAULT_MEMORY_MB", default_value_t = 512)]
    pub default_memory_mb: u64,
    #[arg(long, env = "AGENT_SANDBOX_DEFAULT_PIDS_LIMIT", default_value_t = 256)]
    pub default_pids_limit: u64,
    #[arg(long, env = "AGENT_SANDBOX_TMP_SIZE_MB", default_value_t = 256)]
    pub tmp_size_mb: u64,
    /// `uid:gid` the sandbox's processes run as; never 0.
    #[arg(long, env = "AGENT_SANDBOX_SANDBOX_USER", default_value = "1000:1000")]
    pub sandbox_user: String,
    /// The server's Docker runtime (`runsc` maps to --gvisor-runtime-class).
    #[arg(long, env = "AGENT_SANDBOX_DOCKER_RUNTIME", default_value = "")]
    pub docker_runtime: String,
}

impl ServerDefaults {
    fn options(&self, args: &ExportArgs) -> Result<ExportOptions, CliError> {
        let bad_user = || {
            CliError::Usage(format!(
                "--sandbox-user {:?}: expected uid:gid other than root, e.g. 1000:1000",
                self.sandbox_user
            ))
        };
        let (uid, gid) = self.sandbox_user.split_once(':').ok_or_else(bad_user)?;
        let uid: u32 = uid.parse().map_err(|_| bad_user())?;
        let gid: u32 = gid.parse().map_err(|_| bad_user())?;
        if uid == 0 || gid == 0 {
            return Err(bad_user());
        }
        if !(self.default_cpus.is_finite() && self.default_cpus > 0.0) {
            return Err(CliError::Usage("--default-cpus must be > 0".into()));
        }
        if !is_quantity(&args.workspace_size) {
            return Err(CliError::Usage(format!(
                "--workspace-size {:?}: expected a Kubernetes quantity such as 1Gi or 500M",
                args.workspace_size
            )));
        }
        // `--namespace` (the connection's) is written into every object, and with
        // `--from-server` also names the namespace read.
        if let Some(ns) = &args.connection.namespace {
            if !export::names::is_dns_label(ns) {
                return Err(CliError::Usage(format!(
                    "--namespace {ns:?}: expected a DNS label (lower-case letters, digits, '-')"
                )));
            }
        }
        if self.tmp_size_mb == 0 {
            return Err(CliError::Usage("--tmp-size-mb must be at least 1".into()));
        }
        Ok(ExportOptions {
            defaults: SandboxDefaults {
                image: self.default_image.clone(),
                cpus: self.default_cpus,
                memory_mb: self.default_memory_mb,
                pids_limit: self.default_pids_limit,
                disk_mb: 0,
                egress_by_default: false,
            },
            tmp_size_mb: self.tmp_size_mb,
            run_as_user: uid,
            run_as_group: gid,
            docker_runtime: self.docker_runtime.trim().to_string(),
            gvisor_runtime_class: args.gvisor_runtime_class.clone(),
            start_time: args.start_time.unwrap_or_else(Utc::now),
            namespace: args.connection.namespace.clone(),
            workspace_size: args.workspace_size.clone(),
            storage_class: args.storage_class.clone(),
        })
    }
}

/// Whether `text` is a plain storage quantity: digits, an optional fraction and a unit suffix.
fn is_quantity(text: &str) -> bool {
    const SUFFIXES: [&str; 13] = [
        "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E", "",
    ];
    SUFFIXES.iter().any(|suffix| {
        text.strip_suffix(suffix).is_some_and(|number| {
            let (whole, fraction) = number.split_once('.').unwrap_or((number, "0"));
            !whole.is_empty()
                && !fraction.is_empty()
                && whole
                    .bytes()
                    .chain(fraction.bytes())
                    .all(|b| b.is_ascii_digit())
        })
    })
}

pub async fn export(args: ExportArgs) -> Result<ExitCode, CliError> {
    let Target::Kubernetes = args.to;
    let options = args.server_defaults.options(&args)?;
    let resources = if args.from_server {
        from_server(&args.connection).await?
    } else {
        from_files(&args.files)?
    };
    let exported =
        export::export(&resources, &options).map_err(|e| CliError::Failed(e.to_string()))?;
    if args.strict {
        let refused: Vec<_> = exported.not_expressed().collect();
        if !refused.is_empty() {
            for gap in &refused {
                emit_err(&format!(
                    "error: {}",
                    export::names::comment_safe(&gap.to_string())
                ));
            }
            return Err(CliError::Reported(format!(
                "{} thing(s) cannot be expressed on Kubernetes (--strict)",
                refused.len()
            )));
        }
    }
    let text = exported
        .render(&options)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    emit(&text);
    Ok(ExitCode::SUCCESS)
}

/// Declarations from manifests: server-set metadata and status are not part of them.
fn from_files(files: &[PathBuf]) -> Result<Vec<AnyResource>, CliError> {
    let read = manifests::read(files);
    for error in &read.errors {
        emit_err(&format!("error: {error}"));
    }
    if !read.errors.is_empty() {
        return Err(CliError::Reported(format!(
            "{} invalid document(s) or unreadable path(s); nothing was exported",
            read.errors.len()
        )));
    }
    if read.documents.is_empty() {
        return Err(CliError::Usage(
            "no documents found in the given paths".into(),
        ));
    }
    let mut out = Vec::new();
    for doc in read.documents {
        if doc.resource.name().is_empty() {
            return Err(CliError::Usage(format!(
                "{}:{}: metadata.name: a name is required to export a {}",
                doc.file.display(),
                doc.line,
                doc.resource.kind()
            )));
        }
        out.push(doc.resource.declaration());
    }
    Ok(out)
}

/// Every resource the server holds, with status (a sandbox's deadline is taken from there).
async fn from_server(connection: &Connection) -> Result<Vec<AnyResource>, CliError> {
    let client = Client::new(connection)?;
    let mut out = Vec::new();
    for kind in Kind::ALL {
        let list = client.list_resources(kind, None).await?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        for item in items {
            out.push(parse_item(kind, item)?);
        }
    }
    Ok(out)
}

fn parse_item(kind: Kind, item: Value) -> Result<AnyResource, CliError> {
    let name = item["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    yaml::value_to_resource(item, Some(kind), None).map_err(|e| {
        CliError::Failed(format!(
            "the server's {}/{name} is not a valid document: {e}",
            kind.as_str().to_ascii_lowercase()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        defaults: ServerDefaults,
    }

    #[test]
    fn quantities() {
        for good in ["1Gi", "500M", "1.5Gi", "1024"] {
            assert!(is_quantity(good), "{good}");
        }
        for bad in ["", "Gi", "1 Gi", "1GB", "-1Gi", "1.Gi", "abc"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn server_defaults_match_the_servers() {
        let ours = Wrapper::try_parse_from(["x"]).unwrap().defaults;
        let server = Settings::for_tests(PathBuf::from("/nonexistent"));
        assert_eq!(ours.default_image, server.default_image);
        assert_eq!(ours.default_cpus, server.default_cpus);
        assert_eq!(ours.default_memory_mb, server.default_memory_mb);
        assert_eq!(ours.default_pids_limit, server.default_pids_limit);
        assert_eq!(ours.tmp_size_mb, server.tmp_size_mb);
        assert_eq!(ours.sandbox_user, server.sandbox_user);
        assert_eq!(ours.docker_runtime, server.docker_runtime);
    }
}
