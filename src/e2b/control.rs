//! E2B's control API (`POST /v2/sandboxes`, `GET /v2/sandboxes`, `GET|DELETE /sandboxes/{id}`,
//! `POST /sandboxes/{id}/timeout`, `POST /v2/sandboxes/{id}/connect`) translated onto
//! `Sandbox` resources: what a create asks for becomes a spec and annotations, and a sandbox
//! becomes the objects E2B answers with. Written from E2B's public OpenAPI document
//! (`spec/openapi.yml`). It decides nothing about storage or waiting: `api/e2b` does that.
//!
//! The mapping: `templateID` names a `SandboxTemplate` (`base`, when no template has that name,
//! is the server's default image); `timeout` is the time to live in seconds; `envVars` the
//! sandbox's environment; `allow_internet_access: false` no network; `metadata` is kept in the
//! annotation [`METADATA`] (JSON), the template asked for in [`TEMPLATE`].

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::resource::{Sandbox, SandboxPhase, SandboxSpec};

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
    pub auto_resume: Option<Value>,
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

/// What a create becomes once its template is known.
#[derive(Debug, PartialEq)]
pub struct Wanted {
    pub template: String,
    /// Whether a `SandboxTemplate` of that name exists (else it is `base`: the default image).
    pub from_template: bool,
    pub timeout_seconds: Option<i64>,
    pub env: BTreeMap<String, String>,
    pub allow_internet_access: Option<bool>,
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
    if request.auto_pause == Some(true) {
        return Err(not_supported(
            "autoPause",
            "a sandbox expires at its timeout; pause it explicitly",
        ));
    }
    if request.auto_resume.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(not_supported(
            "autoResume",
            "sandboxes resume on use already",
        ));
    }
    for (field, value, why) in [
        (
            "network",
            &request.network,
            "use a SandboxTemplate with spec.egress",
        ),
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

/// The answer to a create or a connect (`Sandbox` in E2B's API).
#[derive(Debug, Serialize)]
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
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
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
            request(serde_json::json!({"templateID": "base", "network": {"allowOut": ["x"]}})),
            |_| false,
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("network is not supported"));
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
}
