//! JSON Schemas generated from the Rust types, and validation of documents against them.
//!
//! The committed copies in `schemas/` are the contract for people writing manifests and for
//! editors; a test fails when they drift from the types.

use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;

use super::{Fork, Kind, Sandbox, SandboxPool, Snapshot};

pub use super::field_error::FieldError;

/// Gives fixed-size integers the bounds of their Rust type (schemars writes only a `format`), so
/// that what the schema allows also fits the field: `6e27` is a valid JSON Schema integer, and no
/// `u64`.
pub fn integer_bounds(schema: &mut schemars::Schema) {
    let bounds: Option<(i128, i128)> = match schema.get("format").and_then(Value::as_str) {
        Some("uint8") => Some((0, u8::MAX.into())),
        Some("uint16") => Some((0, u16::MAX.into())),
        Some("uint32") => Some((0, u32::MAX.into())),
        Some("uint64") | Some("uint") => Some((0, u64::MAX.into())),
        Some("int8") => Some((i8::MIN.into(), i8::MAX.into())),
        Some("int16") => Some((i16::MIN.into(), i16::MAX.into())),
        Some("int32") => Some((i32::MIN.into(), i32::MAX.into())),
        Some("int64") | Some("int") => Some((i64::MIN.into(), i64::MAX.into())),
        _ => None,
    };
    if let (Some((min, max)), Some(obj)) = (bounds, schema.as_object_mut()) {
        let number = |n: i128| {
            u64::try_from(n)
                .map(Value::from)
                .unwrap_or_else(|_| Value::from(n as i64))
        };
        obj.entry("minimum").or_insert_with(|| number(min));
        obj.entry("maximum").or_insert_with(|| number(max));
    }
    schemars::transform::transform_subschemas(&mut integer_bounds, schema);
}

fn root_schema<T: schemars::JsonSchema>() -> schemars::Schema {
    schemars::generate::SchemaSettings::draft2020_12()
        .with_transform(integer_bounds)
        .into_generator()
        .into_root_schema_for::<T>()
}

/// The JSON Schema of a kind, as committed in `schemas/<kind>.json`.
pub fn schema_of(kind: Kind) -> Value {
    let schema = match kind {
        Kind::Sandbox => root_schema::<Sandbox>(),
        Kind::Snapshot => root_schema::<Snapshot>(),
        Kind::Fork => root_schema::<Fork>(),
        Kind::SandboxPool => root_schema::<SandboxPool>(),
        Kind::Secret => root_schema::<crate::resource::Secret>(),
        Kind::Webhook => root_schema::<crate::resource::Webhook>(),
        Kind::SandboxTemplate => root_schema::<crate::resource::SandboxTemplate>(),
        Kind::ResourceQuota => root_schema::<crate::resource::ResourceQuota>(),
    };
    let mut value = schema.to_value();
    if let Some(obj) = value.as_object_mut() {
        obj.insert(
            "$id".into(),
            Value::String(format!(
                "https://agent-sandbox.io/schemas/{}.json",
                kind.as_str().to_ascii_lowercase()
            )),
        );
    }
    value
}

/// The JSON Schema of the read-only `Event` kind, as committed in `schemas/event.json`: for
/// clients that read events, since nobody declares one.
pub fn event_schema() -> Value {
    let mut value = root_schema::<crate::resource::Event>().to_value();
    if let Some(obj) = value.as_object_mut() {
        obj.insert(
            "$id".into(),
            Value::String("https://agent-sandbox.io/schemas/event.json".into()),
        );
    }
    value
}

/// File name of the committed `Event` schema.
pub const EVENT_SCHEMA_FILE: &str = "event.json";

/// File name of a kind's committed schema.
pub fn schema_file_name(kind: Kind) -> String {
    format!("{}.json", kind.as_str().to_ascii_lowercase())
}

/// Writes every schema into `dir` (used by `agent-sandbox schemas` and the staleness test).
pub fn write_schemas(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for kind in Kind::ALL {
        let text = serde_json::to_string_pretty(&schema_of(kind))? + "\n";
        std::fs::write(dir.join(schema_file_name(kind)), text)?;
    }
    let text = serde_json::to_string_pretty(&event_schema())? + "\n";
    std::fs::write(dir.join(EVENT_SCHEMA_FILE), text)?;
    Ok(())
}

fn validator(kind: Kind) -> &'static jsonschema::Validator {
    static VALIDATORS: OnceLock<Vec<jsonschema::Validator>> = OnceLock::new();
    let all = VALIDATORS.get_or_init(|| {
        Kind::ALL
            .into_iter()
            .map(|k| {
                jsonschema::validator_for(&schema_of(k))
                    .expect("generated schemas are valid JSON Schema")
            })
            .collect()
    });
    let index = Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
    &all[index]
}

/// Validates a document of `kind`; returns every violation, sorted by pointer.
pub fn validate(kind: Kind, document: &Value) -> Result<(), Vec<FieldError>> {
    let mut errors: Vec<FieldError> = validator(kind)
        .iter_errors(document)
        .map(|e| {
            let mut pointer = e.instance_path().as_str().to_string();
            // Point at the unknown field itself, not at the object holding it.
            if let jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } =
                e.kind()
            {
                if let [only] = unexpected.as_slice() {
                    pointer = format!("{pointer}/{}", only.replace('~', "~0").replace('/', "~1"));
                }
            }
            FieldError {
                pointer,
                message: e.to_string(),
            }
        })
        .collect();
    if errors.is_empty() && matches!(kind, Kind::Sandbox | Kind::SandboxTemplate) {
        // What the schema cannot say; the document matches it, so the services parse.
        if let Some(services) = document.pointer("/spec/services") {
            if let Ok(services) =
                serde_json::from_value::<Vec<super::ServiceSpec>>(services.clone())
            {
                errors = super::service::check_services(&services);
            }
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    errors.sort_by(|a, b| a.pointer.cmp(&b.pointer));
    errors.dedup();
    Err(errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sandbox(spec: Value) -> Value {
        json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
               "metadata": {"name": "demo"}, "spec": spec})
    }

    #[test]
    fn accepts_a_full_sandbox() {
        let doc = sandbox(json!({"image": "busybox", "cpus": 1.5, "memoryMB": 256,
            "pidsLimit": 64, "network": false, "readOnlyRootfs": true, "env": {"A": "b"},
            "ttlSeconds": 60, "shutdownTime": "2030-01-01T00:00:00Z",
            "rollback": {"snapshot": "s1", "requestId": "r1"}}));
        validate(Kind::Sandbox, &doc).unwrap();
    }

    #[test]
    fn names_the_field_of_each_violation() {
        let doc = sandbox(json!({"cpus": -1, "memoryMB": "lots", "privileged": true}));
        let errors = validate(Kind::Sandbox, &doc).unwrap_err();
        let fields: Vec<String> = errors.iter().map(FieldError::field).collect();
        assert!(fields.contains(&"spec.cpus".to_string()), "{errors:?}");
        assert!(fields.contains(&"spec.memoryMB".to_string()), "{errors:?}");
        assert!(
            errors.iter().any(|e| e.message.contains("privileged")),
            "unknown field must be named: {errors:?}"
        );
    }

    #[test]
    fn rejects_wrong_kind_and_version() {
        let mut doc = sandbox(json!({}));
        doc["kind"] = json!("Snapshot");
        assert!(validate(Kind::Sandbox, &doc).is_err());
        let mut doc = sandbox(json!({}));
        doc["apiVersion"] = json!("v2");
        assert!(validate(Kind::Sandbox, &doc).is_err());
    }

    #[test]
    fn rejects_bad_names_and_long_display_names() {
        let mut doc = sandbox(json!({}));
        doc["metadata"]["name"] = json!("../etc");
        assert!(validate(Kind::Sandbox, &doc).is_err());
        let snap = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Snapshot",
            "metadata": {"name": "s"}, "spec": {"sandbox": "a", "displayName": "x".repeat(129)}});
        let errors = validate(Kind::Snapshot, &snap).unwrap_err();
        assert_eq!(errors[0].field(), "spec.displayName");
    }

    #[test]
    fn fork_replicas_must_be_positive() {
        let fork = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Fork",
            "metadata": {"name": "f"}, "spec": {"snapshot": "s", "replicas": 0}});
        assert_eq!(
            validate(Kind::Fork, &fork).unwrap_err()[0].field(),
            "spec.replicas"
        );
    }

    #[test]
    fn committed_schemas_are_current() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
        for kind in Kind::ALL {
            let path = dir.join(schema_file_name(kind));
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            let current = serde_json::to_string_pretty(&schema_of(kind)).unwrap() + "\n";
            assert!(
                committed == current,
                "{} is stale: run `cargo run -- schemas` to regenerate it",
                path.display()
            );
        }
        let path = dir.join(EVENT_SCHEMA_FILE);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        let current = serde_json::to_string_pretty(&event_schema()).unwrap() + "\n";
        assert!(
            committed == current,
            "{} is stale: run `cargo run -- schemas` to regenerate it",
            path.display()
        );
    }
}
