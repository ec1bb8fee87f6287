//! E2B's control API (`POST /v2/sandboxes`, `GET /v2/sandboxes`, `GET|DELETE /sandboxes/{id}`,
//! `POST /sandboxes/{id}/timeout`, `POST /v2/sandboxes/{id}/connect`) translated onto
//! `Sandbox` resources: what a create asks for becomes a spec and annotations, and a sandbox
//! becomes the objects E2B answers with. Written from E2B's public OpenAPI document
//! (`spec/openapi.yml`). It decides nothing about storage or waiting: `api/e2b` does that.
//!
//! The mapping: `templateID` names a `SandboxTemplate` (`base`, when no template has that name,
//! is the server's default image); `timeout` is the time to live in seconds; `envVars` the
//! sandbox's environment; `allow_internet_access: false` no network; `metadata` is kept in the
//! annotation [`METADATA`] (JSON), the template asked for in [`TEMPLATE`]; `network`'s
//! `allowOut`/`denyOut` become the egress allow list ([`egress_of`]); `autoPause` (the SDK's
//! `lifecycle.on_timeout: pause`) becomes `spec.expiryAction` and `autoResume` `spec.autoResume`;
//! the answers' `domain` is the preview domain, so that the SDK's `get_host` names a preview host
//! ([`sandbox_domain`]); snapshots and forks are answered as E2B's `SnapshotInfo` and
//! `SandboxForkResult`.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::resource::{ExpiryAction, Sandbox, SandboxPhase, SandboxSpec};

/// The annotation holding an E2B sandbox's metadata (a JSON object of strings).
pub const METADATA: &str = "e2b.dev/metadata";
/// The annotation naming the template an E2B sandbox was created from.
pub const TEMPLATE: &str = "e2b.dev/template";
/// The annotation holding the `Idempotency-Key` a sandbox was created with.
pub const IDEMPOTENCY_KEY: &str = "e2b.dev/idempotency-key";
/// How long a repeated create with the same key answers the same sandbox.
pub const IDEMPOTENCY_HOURS: i64 = 24;
/// The template name that means the server's default image when no template has it.
pub const BASE: &str = "base";
/// The envd version this server answers as: the features of envd 0.5.7 that the SDK switches on
/// by version (stdin flag, default user, closing stdin, octet-stream uploads) are served; later
/// ones (file metadata, watch options) are then refused by the SDK itself with a clear message.
pub const ENVD_VERSION: &str = "0.5.7";
/// What `clientID` (deprecated in E2B's API, still required by its SDK) says.
pub const CLIENT_ID: &str = "agent-sandbox";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ControlError {
    #[error("{0}")]
    Invalid(String),
    #[error("template {0:?} not found: create a SandboxTemplate of that name, or use \"base\"")]
    TemplateNotFound(String),
}

/// `NewSandbox` / `NewSandboxV2`: what a create may carry.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID", default)]
    pub template_id: Option<String>,
    #[serde(default)]
    pub timeout: Option<i64>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access", default)]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    pub auto_pause: Option<bool>,
    #[serde(default)]
    pub auto_pause_memory: Option<bool>,
    #[serde(default)]
    pub auto_resume: Option<AutoResume>,
    #[serde(default)]
    pub network: Option<Value>,
    #[serde(default)]
    pub mcp: Option<Value>,
    #[serde(default)]
    pub iam: Option<Value>,
    #[serde(default)]
    pub volume_mounts: Option<Value>,
    #[serde(default)]
    pub secure: Option<bool>,
}

/// `SandboxAutoResumeConfig`: whether calls resume a paused sandbox.
#[derive(Debug, Default, Deserialize)]
pub struct AutoResume {
    #[serde(default)]
    pub enabled: Option<bool>,
}

/// What a create becomes once its template is known.
#[derive(Debug, PartialEq)]
pub struct Wanted {
    pub template: String,
    /// Whether a `SandboxTemplate` of that name exists (else it is `base`: the default image).
    pub from_template: bool,
    pub timeout_seconds: Option<i64>,
    pub env: BTreeMap<String, String>,
    pub allow_internet_access: Option<bool>,
    /// What `network` (with `allow_internet_access`) asked for; `None` when no `network` came.
    pub egress: Option<Egress>,
    /// `spec.expiryAction` from `autoPause` (`Pause`, or `Stop` when `autoPauseMemory` is false:
    /// a filesystem-only pause); `None` when the timeout deletes the sandbox.
    pub expiry_action: Option<ExpiryAction>,
    /// `spec.autoResume` from `autoResume.enabled`; `None` leaves the server's default.
    pub auto_resume: Option<bool>,
    pub annotations: BTreeMap<String, String>,
}

fn not_supported(field: &str, why: &str) -> ControlError {
    ControlError::Invalid(format!(
        "{field} is not supported by this server yet ({why})"
    ))
}

/// Checks a create, refusing what this server cannot honour rather than ignoring it.
/// `template_exists` says whether a `SandboxTemplate` has the given name.
pub fn plan(
    request: NewSandbox,
    template_exists: impl Fn(&str) -> bool,
) -> Result<Wanted, ControlError> {
    let template = request
        .template_id
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ControlError::Invalid("templateID is required".into()))?;
    let from_template = template_exists(&template);
    if !from_template && template != BASE {
        return Err(ControlError::TemplateNotFound(template));
    }
    let expiry_action = match (request.auto_pause, request.auto_pause_memory) {
        (Some(true), Some(false)) => Some(ExpiryAction::Stop),
        (Some(true), _) => Some(ExpiryAction::Pause),
        _ => None,
    };
    let auto_resume = request.auto_resume.and_then(|a| a.enabled);
    let egress = match request.network.as_ref().filter(|v| !is_empty(v)) {
        None => None,
        Some(value) => {
            let config: NetworkConfig = serde_json::from_value(value.clone())
                .map_err(|e| ControlError::Invalid(format!("network: {e}")))?;
            Some(egress_of(
                &config,
                request.allow_internet_access,
                "network",
            )?)
        }
    };
    for (field, value, why) in [
        ("mcp", &request.mcp, "no MCP gateway inside sandboxes"),
        ("iam", &request.iam, "no cloud identities"),
        ("volumeMounts", &request.volume_mounts, "no E2B volumes"),
    ] {
        if value.as_ref().is_some_and(|v| !is_empty(v)) {
            return Err(not_supported(field, why));
        }
    }
    if let Some(t) = request.timeout {
        if t < 1 {
            return Err(ControlError::Invalid(format!(
                "timeout must be at least 1 second, not {t}"
            )));
        }
    }
    let metadata = request.metadata.unwrap_or_default();
    let mut annotations = BTreeMap::from([(TEMPLATE.to_string(), template.clone())]);
    if !metadata.is_empty() {
        let text = serde_json::to_string(&metadata)
            .map_err(|e| ControlError::Invalid(format!("metadata: {e}")))?;
        annotations.insert(METADATA.to_string(), text);
    }
    Ok(Wanted {
        template,
        from_template,
        timeout_seconds: request.timeout,
        env: request.env_vars.unwrap_or_default(),
        allow_internet_access: request.allow_internet_access,
        egress,
        expiry_action,
        auto_resume,
        annotations,
    })
}

/// Checks an `Idempotency-Key` as E2B's SDK validates it: 1 to 255 of `[a-z0-9-]`.
pub fn check_idempotency_key(key: &str) -> Result<(), ControlError> {
    let ok = (1..=255).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ControlError::Invalid(
            "Idempotency-Key must be 1 to 255 lowercase letters, digits or hyphens".into(),
        ))
    }
}

/// Whether `sandbox` was created with `key` less than [`IDEMPOTENCY_HOURS`] before `now`.
pub fn created_with_key(sandbox: &Sandbox, key: &str, now: DateTime<Utc>) -> bool {
    sandbox
        .metadata
        .annotations
        .get(IDEMPOTENCY_KEY)
        .map(String::as_str)
        == Some(key)
        && sandbox
            .metadata
            .creation_timestamp
            .is_some_and(|t| now - t < chrono::TimeDelta::hours(IDEMPOTENCY_HOURS))
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.values().all(is_empty),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// The spec of a sandbox made from a `SandboxTemplate`: the template fills everything this
/// leaves unset; a refused internet access overrides its network.
pub fn template_spec(wanted: &Wanted, ttl_seconds: u64) -> SandboxSpec {
    SandboxSpec {
        template: Some(wanted.template.clone()),
        env: wanted.env.clone(),
        ttl_seconds: Some(ttl_seconds),
        network: (wanted.allow_internet_access == Some(false)).then_some(false),
        ..SandboxSpec::default()
    }
}

/// The metadata an E2B create gave the sandbox (none for other sandboxes).
pub fn metadata_of(sandbox: &Sandbox) -> BTreeMap<String, String> {
    sandbox
        .metadata
        .annotations
        .get(METADATA)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// The template a sandbox answers with: the one an E2B create named, else its own template, else
/// `base`.
pub fn template_of(sandbox: &Sandbox) -> String {
    sandbox
        .metadata
        .annotations
        .get(TEMPLATE)
        .cloned()
        .or_else(|| sandbox.spec.template.clone())
        .unwrap_or_else(|| BASE.to_string())
}

/// E2B's sandbox states; `None` for a sandbox on its way up or down, which E2B would not list.
pub fn state_of(sandbox: &Sandbox) -> Option<&'static str> {
    match sandbox.status.as_ref().map(|s| s.phase) {
        Some(SandboxPhase::Running) => Some("running"),
        Some(SandboxPhase::Paused | SandboxPhase::Stopped) => Some("paused"),
        _ => None,
    }
}

/// What a `network` config (`SandboxNetworkConfig`, or `SandboxNetworkUpdateConfig`) asks of the
/// sandbox's outbound traffic, in this server's terms.
#[derive(Debug, Clone, PartialEq)]
pub enum Egress {
    /// Nothing denied: the sandbox's network as it would be without the config.
    Open,
    /// Everything denied but these entries (`spec.egress.allow`, with `spec.network: true`).
    Only(Vec<String>),
    /// Everything denied: no network at all (`spec.network: false`).
    Nothing,
}

/// E2B's "all traffic" (and its IPv6 twin).
const ALL_TRAFFIC: [&str; 2] = ["0.0.0.0/0", "::/0"];

/// The network fields of a create's `network` and of `PUT /sandboxes/{id}/network`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    #[serde(default)]
    pub allow_out: Option<Vec<String>>,
    #[serde(default)]
    pub deny_out: Option<Vec<String>>,
    #[serde(default)]
    pub allow_public_traffic: Option<bool>,
    #[serde(default)]
    pub egress_proxy: Option<Value>,
    #[serde(default)]
    pub mask_request_host: Option<Value>,
    #[serde(default)]
    pub rules: Option<Value>,
    #[serde(default)]
    pub dns_servers: Option<Value>,
    #[serde(default)]
    pub https_ports: Option<Value>,
    #[serde(rename = "allow_internet_access", default)]
    pub allow_internet_access: Option<bool>,
}

/// Translates a network config. E2B allows everything not denied, and an allowed entry wins over
/// a denied one; this server's policy is an allow list, so it can say "everything" (nothing
/// denied, or all traffic allowed), "only these" (all traffic denied, `allowOut` allowed) and
/// "nothing" (all traffic denied, nothing allowed). A deny list of some destinations only cannot
/// be said as an allow list and is refused, as are the fields this server has nothing for.
/// `internet: Some(false)` (`allow_internet_access`) denies all traffic, as E2B defines it.
/// `field` names the config in messages (`network`).
pub fn egress_of(
    config: &NetworkConfig,
    internet: Option<bool>,
    field: &str,
) -> Result<Egress, ControlError> {
    for (name, value, why) in [
        (
            "egressProxy",
            &config.egress_proxy,
            "traffic leaves through this server's own gateway",
        ),
        (
            "maskRequestHost",
            &config.mask_request_host,
            "no host masking",
        ),
        (
            "rules",
            &config.rules,
            "use a Secret resource to put credentials in requests",
        ),
        (
            "dnsServers",
            &config.dns_servers,
            "names are resolved by this server's gateway",
        ),
        ("httpsPorts", &config.https_ports, "no per-port TLS"),
    ] {
        if value.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(not_supported(&format!("{field}.{name}"), why));
        }
    }
    // `allowPublicTraffic` either way: a sandbox's preview hosts always want a credential here
    // (the API key, a preview token, or its traffic access token), which is what E2B's `false`
    // asks for; `true` cannot open them to requests that carry none.
    let allow = config.allow_out.clone().unwrap_or_default();
    let deny = config.deny_out.clone().unwrap_or_default();
    if let Some(some) = deny.iter().find(|d| !ALL_TRAFFIC.contains(&d.trim())) {
        return Err(ControlError::Invalid(format!(
            "{field}.denyOut {some:?}: only all traffic (\"0.0.0.0/0\") can be denied here, \
             since this server's egress policy is an allow list: deny all traffic and list what \
             may be reached in allowOut"
        )));
    }
    let deny_all = !deny.is_empty() || internet == Some(false);
    if !deny_all || allow.iter().any(|a| ALL_TRAFFIC.contains(&a.trim())) {
        return Ok(Egress::Open);
    }
    if allow.is_empty() {
        return Ok(Egress::Nothing);
    }
    crate::resource::parse_allow_list(&allow).map_err(|e| {
        ControlError::Invalid(format!(
            "{field}.allowOut[{}] {:?}: {}",
            e.index, e.entry, e.reason
        ))
    })?;
    Ok(Egress::Only(allow))
}

/// Puts what a network config asked for into a sandbox's spec: an allow list (with the network
/// it needs) or no network; `Open` leaves the spec's network as it is.
pub fn apply_egress(spec: &mut SandboxSpec, egress: &Egress) {
    match egress {
        Egress::Open => {}
        Egress::Only(allow) => {
            spec.network = Some(true);
            spec.egress = Some(crate::resource::EgressSpec {
                allow: allow.clone(),
            });
        }
        Egress::Nothing => {
            spec.network = Some(false);
            spec.egress = None;
        }
    }
}

/// The most sandboxes one fork makes (E2B's SDK checks the same bound).
pub const MAX_FORKS: i64 = 20;

/// `SandboxSnapshotRequest`: a snapshot's optional name, and whether to keep memory (which this
/// server never captures: see [`snapshot_request`]).
#[derive(Debug, Default, Deserialize)]
pub struct SnapshotRequest {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub memory: Option<bool>,
}

/// Checks a snapshot request and answers the snapshot's display name. `memory` is accepted
/// either way: a snapshot here holds files, never memory, so a sandbox made from one starts its
/// processes afresh (what E2B's filesystem-only snapshots do).
pub fn snapshot_request(request: SnapshotRequest) -> Result<Option<String>, ControlError> {
    match request.name {
        None => Ok(None),
        Some(n) if n.is_empty() || n.len() > 128 || n.chars().any(char::is_control) => Err(
            ControlError::Invalid("name must be 1 to 128 printable characters".into()),
        ),
        Some(n) => Ok(Some(n)),
    }
}

/// `SandboxForkRequest`: the forks' time to live and how many.
#[derive(Debug, Default, Deserialize)]
pub struct ForkRequest {
    #[serde(default)]
    pub timeout: Option<i64>,
    #[serde(default)]
    pub count: Option<i64>,
}

/// How many sandboxes a fork makes (1 when not said); refuses a count out of 1 to [`MAX_FORKS`]
/// and a timeout under a second.
pub fn fork_count(request: &ForkRequest) -> Result<usize, ControlError> {
    if let Some(t) = request.timeout {
        if t < 1 {
            return Err(ControlError::Invalid(format!(
                "timeout must be at least 1 second, not {t}"
            )));
        }
    }
    match request.count {
        None => Ok(1),
        Some(n) if (1..=MAX_FORKS).contains(&n) => Ok(n as usize),
        Some(n) => Err(ControlError::Invalid(format!(
            "count must be between 1 and {MAX_FORKS}, not {n}"
        ))),
    }
}

/// One fork's outcome (`SandboxForkResult`): exactly one of `sandbox` and `error`.
#[derive(Debug, Serialize)]
pub struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Created>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ForkError>,
}

/// Why one fork failed (E2B's `Error`: the HTTP status it would have had, and a message).
#[derive(Debug, Serialize)]
pub struct ForkError {
    pub code: u16,
    pub message: String,
}

/// A snapshot as E2B shows it (`SnapshotInfo`): its ID (what `Sandbox.create`, `fork` and
/// `delete_snapshot` take) and its names (its display name, else its ID).
#[derive(Debug, Serialize, PartialEq)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

pub fn snapshot_info(id: &str, display_name: Option<&str>) -> SnapshotInfo {
    SnapshotInfo {
        snapshot_id: id.to_string(),
        names: vec![display_name.unwrap_or(id).to_string()],
    }
}

/// Whether a snapshot matches a list's `name` filter: its ID or its display name, with an
/// optional `:default` tag (the only tag a snapshot here has).
pub fn snapshot_matches(filter: &str, id: &str, display_name: Option<&str>) -> bool {
    let wanted = filter.strip_suffix(":default").unwrap_or(filter);
    wanted == id || Some(wanted) == display_name
}

/// The answer to a create or a connect (`Sandbox` in E2B's API).
#[derive(Debug, Clone, Serialize)]
pub struct Created {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    #[serde(rename = "envdVersion")]
    pub envd_version: &'static str,
    #[serde(rename = "envdAccessToken")]
    pub envd_access_token: String,
    /// Opens the sandbox's ports on the preview hosts (`e2b-traffic-access-token`).
    #[serde(rename = "trafficAccessToken")]
    pub traffic_access_token: String,
    /// The preview domain under which `{port}-{sandboxID}.{domain}` reaches the sandbox's ports
    /// (what the SDK's `get_host` builds); none without preview hosts.
    pub domain: Option<String>,
}

/// A sandbox as `GET /sandboxes/{id}` (`SandboxDetail`) and `GET /v2/sandboxes`
/// (`ListedSandbox`) answer it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Detail {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    pub started_at: String,
    pub end_at: String,
    pub envd_version: &'static str,
    pub cpu_count: u64,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub state: &'static str,
    pub metadata: BTreeMap<String, String>,
    pub allow_internet_access: bool,
    pub domain: Option<String>,
    pub lifecycle: Lifecycle,
}

/// `SandboxLifecycle`: what the timeout does (`pause` for a sandbox kept paused or stopped) and
/// whether calls resume it.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    pub on_timeout: &'static str,
    pub auto_resume: bool,
}

/// The lifecycle of `spec`.
pub fn lifecycle_of(spec: &SandboxSpec) -> Lifecycle {
    Lifecycle {
        on_timeout: if spec.expiry_state().is_some() {
            "pause"
        } else {
            "kill"
        },
        auto_resume: spec.auto_resumes(),
    }
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The domain E2B's `get_host(port)` puts after `{port}-{sandboxID}.` so that the host is this
/// server's preview host of that port: the preview domain, under the sandbox's namespace when it
/// is not the default one (`{port}-{name}.{namespace}.{domain}`).
pub fn sandbox_domain(sandbox: &Sandbox, preview_domain: Option<&str>) -> Option<String> {
    let domain = preview_domain?;
    match sandbox.metadata.namespace.as_str() {
        crate::resource::DEFAULT_NAMESPACE | "" => Some(domain.to_string()),
        namespace => Some(format!("{namespace}.{domain}")),
    }
}

/// `sandbox` as E2B shows it; `expires_at` is when it ends (none: never, shown far ahead).
pub fn detail(
    sandbox: &Sandbox,
    expires_at: Option<DateTime<Utc>>,
    defaults: (f64, u64),
) -> Detail {
    let spec = sandbox.resolved_spec();
    let started = sandbox.metadata.creation_timestamp.unwrap_or_else(Utc::now);
    let end = expires_at.unwrap_or(DateTime::<Utc>::MAX_UTC);
    Detail {
        template_id: template_of(sandbox),
        sandbox_id: sandbox.metadata.name.clone(),
        client_id: CLIENT_ID,
        started_at: time(started),
        end_at: time(end),
        envd_version: ENVD_VERSION,
        cpu_count: spec.cpus.unwrap_or(defaults.0).ceil().max(1.0) as u64,
        memory_mb: spec.memory_mb.unwrap_or(defaults.1),
        disk_size_mb: 0,
        state: state_of(sandbox).unwrap_or("running"),
        metadata: metadata_of(sandbox),
        allow_internet_access: spec.network.unwrap_or(false),
        domain: None,
        lifecycle: lifecycle_of(&spec),
    }
}

/// One sample of a sandbox's usage (`SandboxMetric` in E2B's API); disk is not sampled here.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    pub timestamp: String,
    pub timestamp_unix: i64,
    pub cpu_count: u64,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// E2B's metrics from samples `(at, cpu seconds used so far, memory bytes, memory limit)`,
/// oldest first: the CPU share of each is over the time since the one before (the first has no
/// earlier one and is left out), counted against `cpus` cores.
pub fn metrics(samples: &[(DateTime<Utc>, f64, u64, Option<u64>)], cpus: f64) -> Vec<Metric> {
    samples
        .windows(2)
        .map(|pair| {
            let ((before, cpu_before, _, _), (at, cpu, memory, limit)) = (pair[0], pair[1]);
            let elapsed = (at - before).as_seconds_f64();
            let used = if elapsed > 0.0 && cpu >= cpu_before {
                (cpu - cpu_before) / elapsed / cpus.max(0.01) * 100.0
            } else {
                0.0
            };
            Metric {
                timestamp: time(at),
                timestamp_unix: at.timestamp(),
                cpu_count: cpus.ceil().max(1.0) as u64,
                cpu_used_pct: (used * 100.0).round() / 100.0,
                mem_used: memory,
                mem_total: limit.unwrap_or(0),
                mem_cache: 0,
                disk_used: 0,
                disk_total: 0,
            }
        })
        .collect()
}

/// The `metadata` filter of a list: `k=v&k2=v2` whose keys and values the SDK percent-encoded
/// once more before the whole was put in the query.
pub fn metadata_filter(raw: &str) -> Result<BTreeMap<String, String>, ControlError> {
    let mut out = BTreeMap::new();
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| -> Result<String, ControlError> {
            let once = percent_decode(&s.replace('+', " "))?;
            percent_decode(&once)
        };
        out.insert(decode(k)?, decode(v)?);
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Result<String, ControlError> {
    let bad = || ControlError::Invalid(format!("metadata filter {s:?} is not percent-encoded"));
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3).ok_or_else(bad)?;
            let text = std::str::from_utf8(hex).map_err(|_| bad())?;
            out.push(u8::from_str_radix(text, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// Whether a sandbox's metadata has every pair of `filter`.
pub fn matches(sandbox: &Sandbox, filter: &BTreeMap<String, String>) -> bool {
    let metadata = metadata_of(sandbox);
    filter.iter().all(|(k, v)| metadata.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> NewSandbox {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn a_create_becomes_annotations_and_values() {
        let wanted = plan(
            request(serde_json::json!({"templateID": "base", "timeout": 300,
                "metadata": {"owner": "me"}, "envVars": {"A": "1"},
                "allow_internet_access": false, "autoPause": false, "network": null})),
            |_| false,
        )
        .unwrap();
        assert!(!wanted.from_template);
        assert_eq!(wanted.timeout_seconds, Some(300));
        assert_eq!(wanted.env["A"], "1");
        assert_eq!(wanted.allow_internet_access, Some(false));
        assert_eq!(wanted.annotations[METADATA], r#"{"owner":"me"}"#);
        assert_eq!(wanted.annotations[TEMPLATE], "base");
    }

    #[test]
    fn lifecycle_becomes_the_expiry_action_and_auto_resume() {
        let plan_of = |body: Value| plan(request(body), |_| false).unwrap();
        let kill = plan_of(serde_json::json!({"templateID": "base", "autoPause": false}));
        assert_eq!((kill.expiry_action, kill.auto_resume), (None, None));
        let pause = plan_of(serde_json::json!({"templateID": "base", "autoPause": true,
            "autoPauseMemory": true, "autoResume": {"enabled": true}}));
        assert_eq!(pause.expiry_action, Some(ExpiryAction::Pause));
        assert_eq!(pause.auto_resume, Some(true));
        let filesystem = plan_of(serde_json::json!({"templateID": "base", "autoPause": true,
            "autoPauseMemory": false, "autoResume": {"enabled": false}}));
        assert_eq!(filesystem.expiry_action, Some(ExpiryAction::Stop));
        assert_eq!(filesystem.auto_resume, Some(false));
        let mut spec = SandboxSpec::default();
        assert_eq!(
            lifecycle_of(&spec),
            Lifecycle {
                on_timeout: "kill",
                auto_resume: true
            }
        );
        spec.expiry_action = Some(ExpiryAction::Stop);
        spec.auto_resume = Some(false);
        assert_eq!(
            lifecycle_of(&spec),
            Lifecycle {
                on_timeout: "pause",
                auto_resume: false
            }
        );
    }

    #[test]
    fn the_domain_makes_get_host_a_preview_host() {
        let mut sb = Sandbox::new("sb_1", SandboxSpec::default());
        assert_eq!(sandbox_domain(&sb, None), None);
        assert_eq!(
            sandbox_domain(&sb, Some("preview.localhost")).as_deref(),
            Some("preview.localhost")
        );
        sb.metadata.namespace = "team".into();
        let domain = sandbox_domain(&sb, Some("preview.localhost")).unwrap();
        assert_eq!(domain, "team.preview.localhost");
        // What the SDK builds from it is the preview host of that port of that sandbox.
        assert_eq!(
            crate::ports::preview::parse_host(&format!("8000-sb_1.{domain}"), "preview.localhost"),
            crate::ports::preview::PreviewHost::Preview {
                port: 8000,
                name: crate::resource::object_key("team", "sb_1")
            }
        );
    }

    #[test]
    fn unknown_templates_and_unsupported_fields_are_refused_by_name() {
        let err = plan(request(serde_json::json!({"templateID": "nope"})), |_| {
            false
        })
        .unwrap_err();
        assert!(err.to_string().contains("\"nope\" not found"));
        let ok = plan(request(serde_json::json!({"templateID": "py"})), |t| {
            t == "py"
        })
        .unwrap();
        assert!(ok.from_template);
        let err = plan(
            request(serde_json::json!({"templateID": "base", "network": {"denyOut": ["1.1.1.1"]}})),
            |_| false,
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("network.denyOut"));
        let limited = plan(
            request(serde_json::json!({"templateID": "base",
                "network": {"allowOut": ["pypi.org"], "denyOut": ["0.0.0.0/0"]}})),
            |_| false,
        )
        .unwrap();
        assert_eq!(limited.egress, Some(Egress::Only(vec!["pypi.org".into()])));
        let err = plan(
            request(serde_json::json!({"templateID": "base", "mcp": {"x": {"url": "u"}}})),
            |_| false,
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("mcp is not supported"));
        let err = plan(
            request(serde_json::json!({"templateID": "base", "timeout": 0})),
            |_| false,
        )
        .unwrap_err();
        assert!(err.to_string().contains("timeout"));
    }

    #[test]
    fn idempotency_keys_are_checked_and_expire() {
        assert!(check_idempotency_key("job-42").is_ok());
        assert!(check_idempotency_key("Job").is_err());
        assert!(check_idempotency_key("").is_err());
        let now = Utc::now();
        let mut sb = Sandbox::new("sb_1", SandboxSpec::default());
        sb.metadata.creation_timestamp = Some(now - chrono::TimeDelta::hours(1));
        sb.metadata
            .annotations
            .insert(IDEMPOTENCY_KEY.into(), "k".into());
        assert!(created_with_key(&sb, "k", now));
        assert!(!created_with_key(&sb, "other", now));
        assert!(!created_with_key(
            &sb,
            "k",
            now + chrono::TimeDelta::hours(24)
        ));
    }

    #[test]
    fn metrics_share_cpu_over_the_time_between_samples() {
        let t0 = Utc::now();
        let t1 = t0 + chrono::TimeDelta::seconds(10);
        let m = metrics(&[(t0, 1.0, 10, Some(100)), (t1, 6.0, 20, Some(100))], 1.0);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].cpu_used_pct, 50.0);
        assert_eq!((m[0].mem_used, m[0].mem_total), (20, 100));
        assert!(metrics(&[(t0, 1.0, 10, None)], 1.0).is_empty());
    }

    #[test]
    fn the_metadata_filter_is_decoded_twice() {
        // What the SDK sends for {"a b": "c&d", "e": "f"} once the query itself is decoded.
        let f = metadata_filter("a%2520b=c%2526d&e=f").unwrap();
        assert_eq!(f["a b"], "c&d");
        assert_eq!(f["e"], "f");
        assert!(metadata_filter("a=%zz").is_err());
    }

    #[test]
    fn fork_counts_and_snapshot_names() {
        let fork = |v: serde_json::Value| serde_json::from_value::<ForkRequest>(v).unwrap();
        assert_eq!(fork_count(&fork(serde_json::json!({}))), Ok(1));
        assert_eq!(fork_count(&fork(serde_json::json!({"count": 20}))), Ok(20));
        assert_eq!(
            fork_count(&fork(serde_json::json!({"count": 21}))),
            Err(ControlError::Invalid(
                "count must be between 1 and 20, not 21".into()
            ))
        );
        assert!(fork_count(&fork(serde_json::json!({"count": 0}))).is_err());
        assert!(fork_count(&fork(serde_json::json!({"timeout": 0}))).is_err());
        let named = |n: &str| SnapshotRequest {
            name: Some(n.into()),
            memory: Some(true),
        };
        assert_eq!(snapshot_request(named("x")), Ok(Some("x".into())));
        assert!(snapshot_request(named("")).is_err());
        assert!(snapshot_request(named("a\nb")).is_err());
        assert_eq!(snapshot_request(SnapshotRequest::default()), Ok(None));
        assert_eq!(
            snapshot_info("snap_1", None),
            SnapshotInfo {
                snapshot_id: "snap_1".into(),
                names: vec!["snap_1".into()]
            }
        );
        assert_eq!(snapshot_info("snap_1", Some("n")).names, vec!["n"]);
        assert!(snapshot_matches("snap_1", "snap_1", Some("n")));
        assert!(snapshot_matches("n:default", "snap_1", Some("n")));
        assert!(!snapshot_matches("n:v2", "snap_1", Some("n")));
        assert!(!snapshot_matches("m", "snap_1", Some("n")));
    }

    #[test]
    fn network_configs_become_allow_lists_or_are_refused() {
        let config = |v: serde_json::Value| serde_json::from_value::<NetworkConfig>(v).unwrap();
        let egress = |v: serde_json::Value| egress_of(&config(v), None, "network");
        assert_eq!(egress(serde_json::json!({})), Ok(Egress::Open));
        // Allowed entries alone restrict nothing: E2B denies only what denyOut says.
        assert_eq!(
            egress(serde_json::json!({"allowOut": ["pypi.org"]})),
            Ok(Egress::Open)
        );
        assert_eq!(
            egress(
                serde_json::json!({"allowOut": ["pypi.org", "*.example.com", "10.0.0.0/8"],
                "denyOut": ["0.0.0.0/0"]})
            ),
            Ok(Egress::Only(vec![
                "pypi.org".into(),
                "*.example.com".into(),
                "10.0.0.0/8".into()
            ]))
        );
        assert_eq!(
            egress(serde_json::json!({"denyOut": ["0.0.0.0/0"]})),
            Ok(Egress::Nothing)
        );
        assert_eq!(
            egress(serde_json::json!({"allowOut": ["0.0.0.0/0"], "denyOut": ["0.0.0.0/0"]})),
            Ok(Egress::Open)
        );
        assert_eq!(
            egress_of(
                &config(serde_json::json!({"allowOut": ["pypi.org"]})),
                Some(false),
                "network"
            ),
            Ok(Egress::Only(vec!["pypi.org".into()]))
        );
        let refused = egress(serde_json::json!({"denyOut": ["1.1.1.1"]})).unwrap_err();
        assert!(refused
            .to_string()
            .starts_with("network.denyOut \"1.1.1.1\": only all traffic"));
        let bad =
            egress(serde_json::json!({"allowOut": ["ok.org", "*.com"], "denyOut": ["0.0.0.0/0"]}))
                .unwrap_err();
        assert!(
            bad.to_string()
                .starts_with("network.allowOut[1] \"*.com\": "),
            "{bad}"
        );
        let proxy = egress(serde_json::json!({"egressProxy": {"address": "x:1"}})).unwrap_err();
        assert!(proxy.to_string().contains("network.egressProxy"));
        assert_eq!(
            egress(serde_json::json!({"allowPublicTraffic": false})),
            Ok(Egress::Open)
        );
        assert_eq!(
            egress(serde_json::json!({"allowPublicTraffic": true})),
            Ok(Egress::Open)
        );
    }
}
