//! `agent-sandbox export --to kubernetes`: golden outputs for every example, every schema field
//! accounted for, the output parsed back through the Kubernetes API types (k8s-openapi) and
//! checked against the published v1beta1 CRD field paths, hardening invariants over random
//! specs, and the command itself (`--strict`, `--from-server` against a real server).
//!
//! Regenerate the golden files after an intended change of the output with
//! `AGENT_SANDBOX_UPDATE_GOLDEN=1 cargo test --test export_kubernetes golden_outputs` and review
//! the diff.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use agent_sandbox::export::{self, Export, ExportOptions};
use agent_sandbox::resource::{yaml, AnyResource, Kind, SandboxDefaults};
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, PodTemplateSpec};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyEgressRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const UPDATE: &str = "AGENT_SANDBOX_UPDATE_GOLDEN";
const START: &str = "2026-01-01T00:00:00Z";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn start() -> DateTime<Utc> {
    START.parse().unwrap()
}

/// The command's defaults (the server's), with the clock fixed.
fn options() -> ExportOptions {
    ExportOptions {
        defaults: SandboxDefaults {
            image: "python:3.12-slim".into(),
            cpus: 1.0,
            memory_mb: 512,
            pids_limit: 256,
            disk_mb: 0,
            egress_by_default: false,
        },
        tmp_size_mb: 256,
        run_as_user: 1000,
        run_as_group: 1000,
        docker_runtime: String::new(),
        gvisor_runtime_class: "gvisor".into(),
        start_time: start(),
        namespace: None,
        workspace_size: "1Gi".into(),
        storage_class: None,
    }
}

fn read_manifest(path: &Path) -> Vec<AnyResource> {
    let bytes = std::fs::read(path).unwrap();
    let parsed = yaml::parse_file(&bytes, path);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    parsed
        .documents
        .into_iter()
        .map(|d| d.resource.declaration())
        .collect()
}

fn examples() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    files
}

fn golden_dir() -> PathBuf {
    root().join("tests/golden/kubernetes")
}

fn resource(value: Value) -> AnyResource {
    yaml::value_to_resource(value.clone(), None, None).unwrap_or_else(|e| panic!("{e}: {value:#}"))
}

fn export_of(resources: &[AnyResource], options: &ExportOptions) -> Export {
    export::export(resources, options).unwrap()
}

fn rendered(resources: &[AnyResource]) -> String {
    let o = options();
    export_of(resources, &o).render(&o).unwrap()
}

// --- golden files ---

#[test]
fn golden_outputs_match_every_example() {
    let update = std::env::var_os(UPDATE).is_some();
    std::fs::create_dir_all(golden_dir()).unwrap();
    let mut stale = Vec::new();
    let mut expected_files = BTreeSet::new();
    for example in examples() {
        let name = example.file_name().unwrap().to_string_lossy().to_string();
        expected_files.insert(name.clone());
        let text = rendered(&read_manifest(&example));
        let golden = golden_dir().join(&name);
        if update {
            std::fs::write(&golden, &text).unwrap();
        } else if std::fs::read_to_string(&golden).ok().as_deref() != Some(text.as_str()) {
            stale.push(name);
        }
    }
    for entry in std::fs::read_dir(golden_dir()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        if !expected_files.contains(&name) {
            if update {
                std::fs::remove_file(golden_dir().join(&name)).unwrap();
            } else {
                stale.push(format!("{name} (no such example)"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "golden outputs are stale: {stale:?}; regenerate with \
         {UPDATE}=1 cargo test --test export_kubernetes golden_outputs, and review the diff"
    );
}

// --- parsing back through the Kubernetes types ---

/// Parses `value` as `T` and writes it again: equal only when every field is one `T` knows
/// (k8s-openapi drops unknown fields) with the type it expects.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(what: &str, value: &Value) {
    let typed: T = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{what} does not parse: {e}\n{value:#}"));
    let again = serde_json::to_value(&typed).unwrap();
    assert_eq!(&again, value, "{what} does not survive a round trip");
}

fn check_core_types(objects: &[Value]) {
    for object in objects {
        let kind = object["kind"].as_str().unwrap();
        let what = format!("{kind}/{}", object["metadata"]["name"]);
        match kind {
            "NetworkPolicy" => round_trip::<NetworkPolicy>(&what, object),
            "Sandbox" | "SandboxTemplate" => {
                let spec = &object["spec"];
                round_trip::<PodTemplateSpec>(&what, &spec["podTemplate"]);
                for claim in spec["volumeClaimTemplates"].as_array().unwrap() {
                    round_trip::<ObjectMeta>(&what, &claim["metadata"]);
                    round_trip::<PersistentVolumeClaimSpec>(&what, &claim["spec"]);
                }
                if let Some(rules) = spec["networkPolicy"]["egress"].as_array() {
                    for rule in rules {
                        round_trip::<NetworkPolicyEgressRule>(&what, rule);
                    }
                }
            }
            "SandboxWarmPool" => {}
            other => panic!("unexpected kind {other}"),
        }
        round_trip::<ObjectMeta>(&what, &object["metadata"]);
    }
}

#[test]
fn pod_templates_claims_and_network_policies_parse_as_kubernetes_types() {
    for example in examples() {
        let e = export_of(&read_manifest(&example), &options());
        check_core_types(&e.objects);
    }
}

// --- published CRD field paths ---

struct CrdFields {
    /// (apiVersion, kind, path) → type word (`object`, `core`, ...) and enum values.
    types: BTreeMap<(String, String, String), (String, Vec<String>)>,
    required: BTreeSet<(String, String, String)>,
}

fn crd_fields() -> CrdFields {
    let text = std::fs::read_to_string(
        root().join("tests/fixtures/kubernetes/agent-sandbox-v1beta1-fields.txt"),
    )
    .unwrap();
    let mut out = CrdFields {
        types: BTreeMap::new(),
        required: BTreeSet::new(),
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        let key = (
            parts[0].to_string(),
            parts[1].to_string(),
            parts[2].to_string(),
        );
        if parts[3] == "required" {
            out.required.insert(key);
        } else {
            let enums = parts
                .get(4)
                .and_then(|e| e.strip_prefix("enum="))
                .map(|e| e.split(',').map(String::from).collect())
                .unwrap_or_default();
            out.types.insert(key, (parts[3].to_string(), enums));
        }
    }
    out
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::Null => "null",
    }
}

/// Walks `value` at `path` against the fixture; maps (labels, annotations) are leaves.
fn check_crd_path(
    fields: &CrdFields,
    api: &str,
    kind: &str,
    path: &str,
    value: &Value,
    errors: &mut Vec<String>,
) {
    let key = (api.to_string(), kind.to_string(), path.to_string());
    let Some((ty, enums)) = fields.types.get(&key) else {
        errors.push(format!("{kind} {path}: not a field of the published CRD"));
        return;
    };
    if ty == "core" {
        return;
    }
    if ty != json_type(value) {
        errors.push(format!(
            "{kind} {path}: {} where the CRD says {ty}",
            json_type(value)
        ));
        return;
    }
    if !enums.is_empty() && !enums.iter().any(|e| value.as_str() == Some(e)) {
        errors.push(format!("{kind} {path}: {value} is not one of {enums:?}"));
    }
    let has_children = fields
        .types
        .keys()
        .any(|(a, k, p)| a == api && k == kind && p.starts_with(&format!("{path}.")));
    match value {
        Value::Object(map) if has_children => {
            for (k, v) in map {
                check_crd_path(fields, api, kind, &format!("{path}.{k}"), v, errors);
            }
        }
        Value::Array(items) => {
            for item in items {
                check_crd_path(fields, api, kind, &format!("{path}[]"), item, errors);
            }
        }
        _ => {}
    }
}

/// Whether `path` (with `[]` for every element) is present in `value`.
fn all_present(value: &Value, path: &[&str]) -> bool {
    let Some((first, rest)) = path.split_first() else {
        return true;
    };
    let (name, each) = match first.strip_suffix("[]") {
        Some(name) => (name, true),
        None => (*first, false),
    };
    match value.get(name) {
        None => false,
        Some(child) if each => match child.as_array() {
            Some(items) => items.iter().all(|i| all_present(i, rest)),
            None => false,
        },
        Some(child) => all_present(child, rest),
    }
}

fn check_crd_object(fields: &CrdFields, object: &Value, errors: &mut Vec<String>) {
    let api = object["apiVersion"].as_str().unwrap();
    let kind = object["kind"].as_str().unwrap();
    if api == "networking.k8s.io/v1" {
        return;
    }
    assert!(
        export::written_kinds().contains(&(
            if api == export::SANDBOX_API_VERSION {
                export::SANDBOX_API_VERSION
            } else {
                export::EXTENSIONS_API_VERSION
            },
            kind
        )),
        "{api} {kind}"
    );
    let top: BTreeSet<&str> = object
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        top,
        BTreeSet::from(["apiVersion", "kind", "metadata", "spec"])
    );
    check_crd_path(fields, api, kind, "spec", &object["spec"], errors);
    for (a, k, path) in &fields.required {
        if a == api && k == kind {
            let parts: Vec<&str> = path.split('.').collect();
            // A required field under an optional array holds for each element there is.
            let optional_parent = parts[..parts.len() - 1].iter().any(|p| p.ends_with("[]"))
                && !all_present(object, &parts[..1]);
            if !optional_parent && !all_present(object, &parts) {
                errors.push(format!("{kind} {path}: required by the CRD, missing"));
            }
        }
    }
}

#[test]
fn crd_parts_use_the_published_v1beta1_field_names() {
    let fields = crd_fields();
    assert!(fields.types.len() > 40, "the fixture is truncated");
    let mut errors = Vec::new();
    let mut seen = BTreeSet::new();
    for example in examples() {
        for object in export_of(&read_manifest(&example), &options()).objects {
            seen.insert(object["kind"].as_str().unwrap().to_string());
            check_crd_object(&fields, &object, &mut errors);
        }
    }
    assert!(errors.is_empty(), "{errors:#?}");
    for kind in [
        "Sandbox",
        "SandboxTemplate",
        "SandboxWarmPool",
        "NetworkPolicy",
    ] {
        assert!(seen.contains(kind), "no example exports a {kind}");
    }
}

#[test]
fn the_crd_check_catches_a_misspelt_field() {
    let fields = crd_fields();
    let mut object = export_of(
        &read_manifest(&root().join("examples/sandbox.yaml")),
        &options(),
    )
    .objects
    .remove(0);
    object["spec"]["shutdownAt"] = json!("2026-01-01T00:00:00Z");
    object["spec"]["shutdownPolicy"] = json!("Remove");
    object["spec"]
        .as_object_mut()
        .unwrap()
        .remove("podTemplate");
    let mut errors = Vec::new();
    check_crd_object(&fields, &object, &mut errors);
    assert_eq!(errors.len(), 5, "{errors:#?}");
}

// --- every field of our schemas ---

/// A document per kind that sets every field its schema has.
fn full_documents() -> Vec<Value> {
    let meta = |name: &str| {
        json!({ "name": name, "namespace": "team-a", "labels": { "team": "a" },
            "annotations": { "note": "b" } })
    };
    vec![
        json!({
            "apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox", "metadata": meta("full"),
            "spec": {
                "image": "img:1", "cpus": 2.0, "memoryMB": 256, "pidsLimit": 128, "diskMB": 512,
                "network": true, "readOnlyRootfs": false, "env": { "A": "b" },
                "ttlSeconds": 3600, "shutdownTime": "2026-01-01T00:45:00Z", "expiryAction": "Pause",
                "source": { "snapshot": "s1" }, "template": "base",
                "rollback": { "snapshot": "s2", "requestId": "r1" },
                "state": "Paused", "idle": { "afterSeconds": 600, "action": "Stop" },
                "autoResume": false, "imagePullPolicy": "Never",
                "egress": { "allow": ["pypi.org", "10.20.0.0/16:5432"] },
                "secrets": [
                    { "env": "OPENAI_API_KEY", "secret": "openai" },
                    { "env": "GH_TOKEN", "secret": "github" },
                ],
                "services": [
                    { "name": "web", "command": "python3 -m http.server 8000" },
                    { "name": "worker", "argv": ["sleep", "1000"] },
                ],
            },
        }),
        json!({
            "apiVersion": "agent-sandbox.io/v1", "kind": "SandboxPool", "metadata": meta("pool"),
            "spec": {
                "image": "img:1", "size": 4, "readOnlyRootfs": false, "network": true,
                "runtime": "runsc",
            },
        }),
        json!({
            "apiVersion": "agent-sandbox.io/v1", "kind": "Snapshot", "metadata": meta("snap"),
            "spec": { "sandbox": "full", "displayName": "before", "scope": "Full" },
        }),
        json!({
            "apiVersion": "agent-sandbox.io/v1", "kind": "Fork", "metadata": meta("tries"),
            "spec": {
                "snapshot": "snap", "replicas": 3,
                "overrides": { "ttlSeconds": 600, "network": true, "cpus": 2.0, "memoryMB": 1024 },
            },
        }),
    ]
}

/// Leaf field paths of a kind's declared part (spec, and the metadata a person writes), read
/// from the committed JSON Schema, each with the values its schema enumerates (empty when any
/// value of its type will do).
fn schema_leaves(kind: Kind) -> Vec<(String, Vec<Value>)> {
    let file = root().join(format!(
        "schemas/{}.json",
        kind.as_str().to_ascii_lowercase()
    ));
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    fn resolve<'a>(schema: &'a Value, node: &'a Value) -> &'a Value {
        // `{"$ref"}`, or `{"anyOf": [{"$ref"}, {"type": "null"}]}` for an optional object.
        let reference = node
            .get("$ref")
            .or_else(|| {
                ["allOf", "anyOf"]
                    .iter()
                    .filter_map(|k| node.get(*k).and_then(Value::as_array))
                    .flatten()
                    .find_map(|n| n.get("$ref"))
            })
            .and_then(Value::as_str);
        match reference.and_then(|r| r.strip_prefix("#/$defs/")) {
            Some(name) => &schema["$defs"][name],
            None => node,
        }
    }
    fn walk(schema: &Value, node: &Value, path: String, out: &mut Vec<(String, Vec<Value>)>) {
        let node = resolve(schema, node);
        match node.get("properties").and_then(Value::as_object) {
            Some(props) => {
                for (k, v) in props {
                    walk(schema, v, format!("{path}.{k}"), out);
                }
            }
            None => {
                let choices = node.get("enum").and_then(Value::as_array).cloned();
                out.push((path, choices.unwrap_or_default()));
            }
        }
    }
    let mut out = Vec::new();
    walk(
        &schema,
        &schema["properties"]["spec"],
        "spec".into(),
        &mut out,
    );
    for field in ["name", "labels", "annotations"] {
        out.push((format!("metadata.{field}"), Vec::new()));
    }
    out
}

fn pointer(path: &str) -> String {
    format!("/{}", path.replace('.', "/"))
}

/// A different valid value of the same type (another of `choices` when the schema enumerates
/// them).
fn mutate(value: &Value, choices: &[Value]) -> Value {
    if let Some(other) = choices.iter().find(|c| *c != value) {
        return other.clone();
    }
    match value {
        Value::Bool(b) => json!(!b),
        Value::Number(n) if n.is_u64() => json!((n.as_u64().unwrap() / 2).max(1)),
        Value::Number(n) => json!(n.as_f64().unwrap() / 2.0),
        Value::String(s) => match s.parse::<DateTime<Utc>>() {
            Ok(t) => json!((t + chrono::TimeDelta::minutes(10)).to_rfc3339()),
            Err(_) => json!(format!("{s}x")),
        },
        Value::Object(map) => {
            let mut map = map.clone();
            map.insert("extra".into(), json!("y"));
            Value::Object(map)
        }
        // One item fewer (the full documents give every list two).
        Value::Array(items) if items.len() > 1 => json!(items[..items.len() - 1]),
        other => panic!("no mutation for {other}"),
    }
}

#[test]
fn every_schema_field_changes_the_output_or_is_listed() {
    for doc in full_documents() {
        let kind: Kind = doc["kind"].as_str().unwrap().parse().unwrap();
        let base = rendered(&[resource(doc.clone())]);
        for (path, choices) in schema_leaves(kind) {
            let at = pointer(&path);
            let current = doc
                .pointer(&at)
                .unwrap_or_else(|| panic!("the full {kind} document does not set {path}"));
            let mut changed = doc.clone();
            *changed.pointer_mut(&at).unwrap() = mutate(current, &choices);
            // An allow-list needs the network: turning it off takes the list with it.
            if changed["spec"]["network"] == false {
                if let Some(spec) = changed["spec"].as_object_mut() {
                    spec.remove("egress");
                    spec.remove("secrets");
                }
            }
            let after = rendered(&[resource(changed)]);
            assert_ne!(
                base, after,
                "{kind} {path}: a change of it changes nothing exported"
            );
        }
    }
}

#[test]
fn what_cannot_be_expressed_is_listed_as_such() {
    let resources: Vec<AnyResource> = full_documents().into_iter().map(resource).collect();
    let e = export_of(&resources, &options());
    let lost: BTreeSet<(String, Option<String>)> = e
        .not_expressed()
        .map(|g| (g.object.clone(), g.field.clone()))
        .collect();
    for expected in [
        ("sandbox/full", Some("spec.pidsLimit")),
        ("sandbox/full", Some("spec.source.snapshot")),
        ("sandbox/full", Some("spec.rollback")),
        ("snapshot/snap", None),
        ("fork/tries", None),
    ] {
        let key = (expected.0.to_string(), expected.1.map(String::from));
        assert!(lost.contains(&key), "{expected:?} missing from {lost:#?}");
    }
    let text = e.render(&options()).unwrap();
    let header: Vec<&str> = text.lines().take_while(|l| *l != "---").collect();
    for gap in &e.gaps {
        assert!(
            header.iter().any(|l| l.contains(&gap.reason)),
            "{gap} is not in the comment block"
        );
    }
    let kinds: Vec<&str> = e
        .objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "Sandbox",
            "NetworkPolicy",
            "SandboxTemplate",
            "SandboxWarmPool"
        ]
    );
    // The pool's runtime is runsc: gVisor's RuntimeClass.
    assert_eq!(
        e.objects[2]["spec"]["podTemplate"]["spec"]["runtimeClassName"],
        "gvisor"
    );
    // The earlier of ttlSeconds (01:00) and shutdownTime (00:45) wins.
    assert_eq!(e.objects[0]["spec"]["shutdownTime"], "2026-01-01T00:45:00Z");
}

// --- invariants over random specs ---

fn random_key(rng: &mut StdRng) -> String {
    const PARTS: [&str; 12] = [
        "A", "b", "_", "9", "-", ".", "x y", "=", "HOME", "\n", "é", "app.io/",
    ];
    (0..rng.random_range(1..4))
        .map(|_| PARTS[rng.random_range(0..PARTS.len())])
        .collect()
}

fn random_name(rng: &mut StdRng, i: usize) -> String {
    let middle: String = (0..rng.random_range(0..6))
        .map(|_| ['a', '7', '-', '_'][rng.random_range(0..4)])
        .collect();
    format!("s{middle}{i}")
}

fn random_resources(rng: &mut StdRng, count: usize) -> Vec<AnyResource> {
    let mut out = Vec::new();
    for i in 0..count {
        let mut labels = serde_json::Map::new();
        for _ in 0..rng.random_range(0..3) {
            labels.insert(random_key(rng), json!(random_key(rng)));
        }
        let mut env = serde_json::Map::new();
        for _ in 0..rng.random_range(0..4) {
            env.insert(random_key(rng), json!(random_key(rng)));
        }
        let name = random_name(rng, i);
        let doc = if rng.random_bool(0.2) {
            let mut spec = json!({ "image": "img:1", "size": rng.random_range(0..10) });
            if rng.random_bool(0.5) {
                spec["network"] = json!(rng.random_bool(0.5));
            }
            if rng.random_bool(0.5) {
                spec["readOnlyRootfs"] = json!(rng.random_bool(0.5));
            }
            if rng.random_bool(0.3) {
                spec["runtime"] = json!(["runsc", "", "kata"][rng.random_range(0..3)]);
            }
            json!({ "apiVersion": "agent-sandbox.io/v1", "kind": "SandboxPool",
                    "metadata": { "name": name, "labels": labels }, "spec": spec })
        } else {
            let mut spec = json!({ "env": env });
            if rng.random_bool(0.5) {
                spec["cpus"] = json!(rng.random_range(10..4000) as f64 / 1000.0);
            }
            if rng.random_bool(0.5) {
                spec["memoryMB"] = json!(rng.random_range(16..8192));
            }
            if rng.random_bool(0.3) {
                spec["pidsLimit"] = json!(rng.random_range(8..4096));
            }
            if rng.random_bool(0.5) {
                spec["network"] = json!(rng.random_bool(0.5));
            }
            if rng.random_bool(0.5) {
                spec["readOnlyRootfs"] = json!(rng.random_bool(0.5));
            }
            if rng.random_bool(0.5) {
                spec["ttlSeconds"] = json!(rng.random_range(1..100_000));
            }
            if rng.random_bool(0.2) {
                spec["source"] = json!({ "snapshot": "snap" });
            }
            json!({ "apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                    "metadata": { "name": name, "labels": labels }, "spec": spec })
        };
        out.push(resource(doc));
    }
    out
}

/// Every key anywhere in `value` with its value.
fn visit<'a>(value: &'a Value, f: &mut impl FnMut(&'a str, &'a Value)) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                f(k, v);
                visit(v, f);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| visit(i, f)),
        _ => {}
    }
}

fn check_hardening(object: &Value, runtime: &str, problems: &mut Vec<String>) {
    let what = format!("{}/{}", object["kind"], object["metadata"]["name"]);
    let mut bad = |m: String| problems.push(format!("{what}: {m}"));
    visit(object, &mut |key, value| match key {
        "privileged" | "hostNetwork" | "hostPID" | "hostIPC" if value != &json!(false) => {
            bad(format!("{key}: {value}"))
        }
        "hostPath" | "hostPort" | "add" => bad(format!("{key} present")),
        _ => {}
    });
    let Some(pod) = object["spec"]["podTemplate"]["spec"].as_object() else {
        return;
    };
    let pod = Value::Object(pod.clone());
    if pod["automountServiceAccountToken"] != json!(false) {
        bad("the service account token is mounted".into());
    }
    if pod["securityContext"]["runAsNonRoot"] != json!(true) {
        bad("pod runAsNonRoot is not true".into());
    }
    if pod["securityContext"]["runAsUser"] == json!(0)
        || pod["securityContext"]["runAsGroup"] == json!(0)
    {
        bad("runs as root".into());
    }
    if pod["securityContext"]["seccompProfile"]["type"] != "RuntimeDefault" {
        bad("no RuntimeDefault seccomp profile".into());
    }
    for volume in pod["volumes"].as_array().unwrap() {
        let sources: Vec<&String> = volume
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "name")
            .collect();
        if sources != ["emptyDir"] || volume["emptyDir"]["medium"] != "Memory" {
            bad(format!("volume {volume}"));
        }
    }
    let containers = pod["containers"].as_array().unwrap();
    if containers.is_empty() {
        bad("no container".into());
    }
    for c in containers
        .iter()
        .chain(pod["initContainers"].as_array().into_iter().flatten())
    {
        let sc = &c["securityContext"];
        if sc["capabilities"]["drop"] != json!(["ALL"]) {
            bad("capabilities are not drop: [ALL]".into());
        }
        if sc["runAsNonRoot"] != json!(true) || sc["allowPrivilegeEscalation"] != json!(false) {
            bad(format!("container securityContext {sc}"));
        }
        if sc["seccompProfile"]["type"] != "RuntimeDefault" {
            bad("container without RuntimeDefault seccomp".into());
        }
        if c["resources"]["limits"]["cpu"].is_null() || c["resources"]["limits"]["memory"].is_null()
        {
            bad("no CPU or memory limit".into());
        }
        if c["resources"]["limits"] != c["resources"]["requests"] {
            bad("requests differ from limits (not Guaranteed)".into());
        }
    }
    let class = pod.get("runtimeClassName").and_then(Value::as_str);
    match runtime {
        "runsc" if class != Some("gvisor") => bad(format!("runsc but runtimeClassName {class:?}")),
        "" if class.is_some() => bad(format!("default runtime but runtimeClassName {class:?}")),
        other if !other.is_empty() && other != "runsc" && class != Some(other) => {
            bad(format!("runtime {other} but runtimeClassName {class:?}"))
        }
        _ => {}
    }
}

#[test]
fn random_specs_never_lose_the_hardening() {
    let mut rng = StdRng::seed_from_u64(0x5eed_0026);
    for round in 0..40 {
        let resources = random_resources(&mut rng, 12);
        let mut o = options();
        o.docker_runtime = ["", "runsc"][round % 2].to_string();
        o.run_as_user = rng.random_range(1..70_000);
        o.run_as_group = rng.random_range(1..70_000);
        if round % 3 == 0 {
            o.namespace = Some("agents".into());
        }
        let e = export_of(&resources, &o);
        let mut problems = Vec::new();
        for object in &e.objects {
            let runtime = match object["kind"].as_str() {
                Some("SandboxTemplate") => {
                    let name = object["metadata"]["name"].as_str().unwrap();
                    let pool = resources
                        .iter()
                        .filter_map(AnyResource::as_pool)
                        .find(|p| p.metadata.name.replace('_', "-") == name)
                        .unwrap();
                    pool.spec
                        .runtime
                        .clone()
                        .unwrap_or(o.docker_runtime.clone())
                }
                _ => o.docker_runtime.clone(),
            };
            check_hardening(object, &runtime, &mut problems);
        }
        // Every exported sandbox has a NetworkPolicy, denying egress exactly when it has no network.
        for s in resources.iter().filter_map(AnyResource::as_sandbox) {
            let name = s.metadata.name.replace('_', "-");
            let exported = e
                .objects
                .iter()
                .any(|o| o["kind"] == "Sandbox" && o["metadata"]["name"] == name.as_str());
            if !exported {
                continue;
            }
            let policy = e
                .objects
                .iter()
                .find(|o| {
                    o["kind"] == "NetworkPolicy"
                        && o["metadata"]["name"] == format!("{name}-network").as_str()
                })
                .unwrap_or_else(|| panic!("no NetworkPolicy for {name}"));
            let types = policy["spec"]["policyTypes"].clone();
            if s.spec.network == Some(true) {
                assert_eq!(types, json!(["Ingress"]), "{name}");
            } else {
                assert_eq!(types, json!(["Ingress", "Egress"]), "{name}");
                assert!(policy["spec"].get("egress").is_none(), "{name}");
            }
            assert!(policy["spec"].get("ingress").is_none(), "{name}");
        }
        assert!(problems.is_empty(), "round {round}: {problems:#?}");
        check_core_types(&e.objects);
        let fields = crd_fields();
        let mut errors = Vec::new();
        for object in &e.objects {
            check_crd_object(&fields, object, &mut errors);
        }
        assert!(errors.is_empty(), "round {round}: {errors:#?}");
        // Whatever the keys, the comment block stays a comment block.
        let text = e.render(&o).unwrap();
        let header: Vec<&str> = text.lines().take_while(|l| *l != "---").collect();
        assert!(header.iter().all(|l| l.starts_with('#')), "{header:#?}");
        assert_eq!(
            text.matches("\n---\n").count() + usize::from(text.starts_with("---\n")),
            e.objects.len()
        );
    }
}

#[test]
fn the_invariant_check_catches_a_weakened_pod() {
    let mut object = export_of(
        &read_manifest(&root().join("examples/sandbox.yaml")),
        &options(),
    )
    .objects
    .remove(0);
    let pod = &mut object["spec"]["podTemplate"]["spec"];
    pod["hostPID"] = json!(true);
    pod["containers"][0]["securityContext"]["capabilities"] =
        json!({ "drop": ["ALL"], "add": ["NET_ADMIN"] });
    pod["containers"][0]["securityContext"]["runAsNonRoot"] = json!(false);
    pod["volumes"][0] = json!({ "name": "host", "hostPath": { "path": "/" } });
    let mut problems = Vec::new();
    check_hardening(&object, "", &mut problems);
    assert!(problems.len() >= 4, "{problems:#?}");
}

#[test]
fn root_is_refused() {
    let mut o = options();
    o.run_as_user = 0;
    assert!(export::export(&[], &o).is_err());
}

#[test]
fn names_kubernetes_refuses_are_renamed_and_reported() {
    let r = resource(
        json!({ "apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": { "name": "sb_2f10f5a9403f25d0" }, "spec": {} }),
    );
    let twin = resource(
        json!({ "apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": { "name": "sb-2f10f5a9403f25d0" }, "spec": {} }),
    );
    let e = export_of(&[r, twin], &options());
    assert_eq!(e.objects[0]["metadata"]["name"], "sb-2f10f5a9403f25d0");
    let lost: Vec<_> = e.not_expressed().collect();
    assert_eq!(lost.len(), 2, "{lost:#?}");
    assert!(lost[1].reason.contains("already taken"), "{}", lost[1]);
    assert_eq!(e.objects.len(), 2);
}

// --- the command ---

fn agent_sandbox(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"));
    cmd.current_dir(root()).args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("AGENT_SANDBOX_") {
            cmd.env_remove(key);
        }
    }
    cmd.output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_command_prints_the_golden_output() {
    let out = agent_sandbox(&[
        "export",
        "--to",
        "kubernetes",
        "-f",
        "examples/pool.yaml",
        "--start-time",
        START,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let golden = std::fs::read_to_string(golden_dir().join("pool.yaml")).unwrap();
    assert_eq!(text(&out.stdout), golden);
}

#[test]
fn strict_fails_with_the_reasons_when_something_cannot_be_expressed() {
    let out = agent_sandbox(&[
        "export",
        "--to",
        "kubernetes",
        "--strict",
        "-f",
        "examples/team.yaml",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("snapshot/builder-baseline"), "{stderr}");
    assert!(stderr.contains("--strict"), "{stderr}");

    let out = agent_sandbox(&[
        "export",
        "--to",
        "kubernetes",
        "--strict",
        "-f",
        "examples/sandbox.yaml",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("spec.pidsLimit"),
        "{}",
        text(&out.stderr)
    );

    // Without --strict the same file exports, the loss listed in the comment block.
    let out = agent_sandbox(&["export", "--to", "kubernetes", "-f", "examples/team.yaml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("#   snapshot/builder-baseline: not exported"));

    // What can be expressed passes --strict.
    let out = agent_sandbox(&[
        "export",
        "--to",
        "kubernetes",
        "--strict",
        "-f",
        "examples/pool.yaml",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn bad_input_and_flags_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: x\nspec:\n  privileged: true\n").unwrap();
    let out = agent_sandbox(&["export", "--to", "kubernetes", "-f", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("bad.yaml:6"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());

    let out = agent_sandbox(&[
        "export",
        "--to",
        "kubernetes",
        "-f",
        "examples/pool.yaml",
        "--sandbox-user",
        "0:0",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("root"), "{}", text(&out.stderr));

    let out = agent_sandbox(&["export", "--to", "kubernetes"]);
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
    let out = agent_sandbox(&[
        "export",
        "--to",
        "kubernetes",
        "-f",
        "examples",
        "--from-server",
    ]);
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
}

#[test]
fn from_server_exports_what_a_running_server_holds() {
    let server = common::Server::start();
    let name = common::unique("k8s");
    let (status, body) = server.request(
        "POST",
        &format!("{}/sandboxes", common::API),
        Some(&json!({
            "apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
            "metadata": { "name": name, "labels": { "team": "x" } },
            "spec": { "ttlSeconds": 600, "memoryMB": 128 },
        })),
    );
    assert!(status < 300, "{status} {body}");
    let (status, body) = server.request(
        "POST",
        &format!("{}/sandboxpools", common::API),
        Some(&json!({
            "apiVersion": "agent-sandbox.io/v1", "kind": "SandboxPool",
            "metadata": { "name": format!("{name}-pool") },
            "spec": { "image": common::TEST_IMAGE, "size": 0 },
        })),
    );
    assert!(status < 300, "{status} {body}");
    let running = server.wait_running(&name);
    let expires: DateTime<Utc> = running["status"]["expiresAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"));
    let out = cmd
        .args([
            "export",
            "--to",
            "kubernetes",
            "--from-server",
            "--server",
            &server.url,
        ])
        .env("AGENT_SANDBOX_API_KEY", &server.key)
        .env("AGENT_SANDBOX_DEFAULT_IMAGE", common::TEST_IMAGE)
        .env("AGENT_SANDBOX_DOCKER_RUNTIME", common::test_runtime())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains(&format!("  name: {name}\n")), "{stdout}");
    assert!(
        stdout.contains(&format!("  name: {name}-pool\n")),
        "{stdout}"
    );
    assert!(stdout.contains("memory: 128Mi"), "{stdout}");
    // The deadline is the server's own, not one counted from the export.
    let at = expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(
        stdout.contains(&format!("shutdownTime: \"{at}\""))
            || stdout.contains(&format!("shutdownTime: {at}")),
        "{at} not in {stdout}"
    );
    assert!(!stdout.contains("spec.ttlSeconds: a lifetime"), "{stdout}");
    // The server's runtime, told to the export as to the server: gVisor's RuntimeClass.
    assert_eq!(
        stdout.contains("runtimeClassName: gvisor"),
        common::test_runtime() == "runsc",
        "{stdout}"
    );

    let (status, _) = server.request("DELETE", &format!("{}/sandboxes/{name}", common::API), None);
    assert!(status < 300);
    server.wait_gone("sandboxes", &name);

    // A server that is not there is one line and exit 1.
    let out = agent_sandbox(&[
        "export",
        "--to",
        "kubernetes",
        "--from-server",
        "--server",
        "http://127.0.0.1:9",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot reach"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
#[should_panic(expected = "does not survive a round trip")]
fn the_round_trip_catches_a_misspelt_pod_field() {
    let mut object = export_of(
        &read_manifest(&root().join("examples/sandbox.yaml")),
        &options(),
    )
    .objects
    .remove(0);
    object["spec"]["podTemplate"]["spec"]["automountServiceAccountTokens"] = json!(false);
    check_core_types(&[object]);
}
