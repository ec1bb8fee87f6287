//! `diff -f`: what `apply` would change, field by field, and what each change costs the running
//! sandbox: applied in place, a new container (state outside `/workspace` lost, `/workspace`
//! kept), a workspace replaced by a snapshot, sandboxes deleted, or nothing because the field is
//! immutable. Exit codes follow kubectl: 0 no differences, 1 differences, 2 an error.
//!
//! The classification mirrors the controller's rules; it only reads the server, and every change
//! is also checked by the server with a dry run so that `diff` reports what `apply` would refuse.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use super::apply::{read_all, same_as_server};
use super::client::{Client, Connection};
use super::manifests::Document;
use super::util::table;
use super::{emit, emit_err, CliError};
use crate::resource::{AnyResource, Kind};

#[derive(Args, Debug)]
#[command(
    after_help = "Exit status: 0 when nothing differs, 1 when something does, 2 on error.

Examples:
  agent-sandbox diff -f sandbox.yaml
  agent-sandbox diff -f manifests/ && echo 'in sync'"
)]
pub struct DiffArgs {
    /// A manifest file, a folder (read recursively) or `-` for standard input. Repeatable.
    #[arg(short = 'f', long = "filename", required = true, value_name = "PATH")]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub connection: Connection,
}

/// What a change does to what runs, from least to most disruptive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Impact {
    /// The server keeps the field's old effect: it is immutable.
    Ignored,
    InPlace,
    /// A new container on the same workspace volume.
    ReplacesContainer,
    /// The workspace is replaced by a snapshot's content (and the container with it).
    ReplacesWorkspace,
    /// Sandboxes are deleted, workspaces and all.
    DeletesSandboxes,
}

impl Impact {
    pub fn describe(self) -> &'static str {
        match self {
            Impact::Ignored => "immutable: the server keeps the old value's effect",
            Impact::InPlace => "in place",
            Impact::ReplacesContainer => {
                "replaces the container: state outside /workspace is lost, /workspace is kept"
            }
            Impact::ReplacesWorkspace => {
                "replaces the container and the workspace with the snapshot's content: \
                 everything not in that snapshot is lost"
            }
            Impact::DeletesSandboxes => "deletes sandboxes with their workspaces",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub field: String,
    pub from: Option<Value>,
    pub to: Option<Value>,
    pub impact: Impact,
    /// What this change does, in words, when the impact alone does not say it.
    pub note: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    Create,
    Unchanged,
    Update(Vec<Change>),
}

impl Plan {
    /// The most disruptive impact of an update.
    pub fn impact(&self) -> Option<Impact> {
        match self {
            Plan::Update(changes) => changes.iter().map(|c| c.impact).max(),
            _ => None,
        }
    }
}

/// Flattens objects into dotted leaf paths; arrays and scalars are leaves.
fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                flatten(&format!("{prefix}.{k}"), v, out);
            }
        }
        Value::Null => {}
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

fn declared_fields(value: &Value) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    flatten("spec", &value["spec"], &mut out);
    flatten("metadata.labels", &value["metadata"]["labels"], &mut out);
    flatten(
        "metadata.annotations",
        &value["metadata"]["annotations"],
        &mut out,
    );
    out
}

/// What applying `wanted` over the server's copy `server` would do.
pub fn plan(server: Option<&Value>, wanted: &AnyResource) -> Plan {
    let Some(server) = server else {
        return Plan::Create;
    };
    if same_as_server(server, wanted) {
        return Plan::Unchanged;
    }
    let before = declared_fields(server);
    let after = declared_fields(&wanted.declaration().to_json());
    let mut fields: Vec<&String> = before.keys().chain(after.keys()).collect();
    fields.sort();
    fields.dedup();
    let mut changes = Vec::new();
    for field in fields {
        let from = before.get(field);
        let to = after.get(field);
        if from == to {
            continue;
        }
        let (impact, note) = classify(wanted.kind(), field, from, to, server, wanted);
        changes.push(Change {
            field: field.clone(),
            from: from.cloned(),
            to: to.cloned(),
            impact,
            note,
        });
    }
    Plan::Update(changes)
}

fn classify(
    kind: Kind,
    field: &str,
    from: Option<&Value>,
    to: Option<&Value>,
    server: &Value,
    wanted: &AnyResource,
) -> (Impact, Option<String>) {
    if field.starts_with("metadata.") {
        return (Impact::InPlace, None);
    }
    let leaf = field.trim_start_matches("spec.");
    // By name rather than an exhaustive match: a kind this table does not know yet is reported
    // field by field with no promise beyond "in place".
    match kind.as_str() {
        "Sandbox" => classify_sandbox(leaf, server, wanted),
        "Snapshot" => (
            Impact::Ignored,
            Some("immutable: a snapshot is taken once; the server refuses spec changes".into()),
        ),
        "Fork" => classify_fork(leaf, from, to),
        "SandboxTemplate" => (
            Impact::InPlace,
            Some(
                "new sandboxes made from the template get it; sandboxes already made from it \
                 keep the values they took"
                    .into(),
            ),
        ),
        "SandboxPool" if leaf != "size" => (
            Impact::InPlace,
            Some(
                "replaces the pool's unassigned containers; sandboxes already running are not \
                 touched"
                    .into(),
            ),
        ),
        _ => (Impact::InPlace, None),
    }
}

fn classify_sandbox(leaf: &str, server: &Value, wanted: &AnyResource) -> (Impact, Option<String>) {
    let top = leaf.split('.').next().unwrap_or(leaf);
    match top {
        "cpus" | "memoryMB" | "pidsLimit" | "ttlSeconds" | "shutdownTime" | "env" => {
            (Impact::InPlace, None)
        }
        "image" | "network" | "readOnlyRootfs" => (Impact::ReplacesContainer, None),
        "services" => (
            Impact::InPlace,
            Some("restarts only the services it changes, in the same container".into()),
        ),
        "egress" => {
            let had = !server["spec"]["egress"].is_null();
            let has = wanted.as_sandbox().is_some_and(|s| s.spec.egress.is_some());
            if had && has {
                (
                    Impact::InPlace,
                    Some("the gateway applies the new list from the next connection on".into()),
                )
            } else {
                (
                    Impact::ReplacesContainer,
                    Some(
                        "moves the sandbox between the open network and the egress gateway's \
                         internal one (without the server's AGENT_SANDBOX_EGRESS_DEFAULT list)"
                            .into(),
                    ),
                )
            }
        }
        "source" => (
            Impact::Ignored,
            Some(
                "immutable: the server keeps the workspace this sandbox was built from and \
                 refuses the change (use a rollback to replace the workspace)"
                    .into(),
            ),
        ),
        "rollback" => {
            let wanted_request = wanted
                .as_sandbox()
                .and_then(|s| s.spec.rollback.as_ref())
                .map(|r| (r.request_id.clone(), r.snapshot.clone()));
            let old_request = server["spec"]["rollback"]["requestId"].as_str();
            let done = server["status"]["lastRollback"]["requestId"].as_str();
            match wanted_request {
                Some((id, snapshot))
                    if Some(id.as_str()) != old_request && Some(id.as_str()) != done =>
                {
                    (
                        Impact::ReplacesWorkspace,
                        Some(format!(
                            "rolls back: the workspace is replaced by snapshot {snapshot}'s \
                             content (requestId {id:?} is new)"
                        )),
                    )
                }
                Some(_) => (
                    Impact::Ignored,
                    Some("no rollback: only a new requestId asks for one".into()),
                ),
                None => (Impact::InPlace, Some("no effect on the sandbox".into())),
            }
        }
        _ => (Impact::InPlace, None),
    }
}

fn classify_fork(leaf: &str, from: Option<&Value>, to: Option<&Value>) -> (Impact, Option<String>) {
    match leaf {
        "replicas" => {
            let from = from.and_then(Value::as_u64).unwrap_or(1);
            let to = to.and_then(Value::as_u64).unwrap_or(1);
            if to > from {
                (
                    Impact::InPlace,
                    Some(format!(
                        "starts {} more sandbox(es) from the snapshot",
                        to - from
                    )),
                )
            } else {
                (
                    Impact::DeletesSandboxes,
                    Some(format!(
                        "deletes {} child sandbox(es) (the highest numbers) with their workspaces",
                        from - to
                    )),
                )
            }
        }
        "snapshot" => (
            Impact::Ignored,
            Some(
                "existing children keep their workspaces (a sandbox's source is immutable); only \
                 new children start from the new snapshot"
                    .into(),
            ),
        ),
        "overrides.network" => (
            Impact::ReplacesContainer,
            Some(
                "replaces every child's container: state outside /workspace is lost, /workspace \
                 is kept"
                    .into(),
            ),
        ),
        _ => (
            Impact::InPlace,
            Some("applied to every child in place".into()),
        ),
    }
}

fn show(value: &Option<Value>) -> String {
    match value {
        None => "<unset>".into(),
        Some(v) => v.to_string(),
    }
}

/// The report of one resource; empty when it does not differ.
pub fn render(doc_ref: &str, plan: &Plan) -> String {
    match plan {
        Plan::Unchanged => String::new(),
        Plan::Create => format!("{doc_ref}: created (new)\n"),
        Plan::Update(changes) => {
            let impact = plan.impact().unwrap_or(Impact::InPlace);
            let mut out = format!("{doc_ref}: configured; {}\n", impact.describe());
            let rows: Vec<Vec<String>> = changes
                .iter()
                .map(|c| {
                    vec![
                        c.field.clone(),
                        format!("{} -> {}", show(&c.from), show(&c.to)),
                        c.note.clone().unwrap_or_else(|| c.impact.describe().into()),
                    ]
                })
                .collect();
            for line in table(&["FIELD", "CHANGE", "EFFECT"], &rows).lines() {
                out.push_str(&format!("  {line}\n"));
            }
            out
        }
    }
}

/// When the server's sandbox was made from an older generation of its template than the
/// template's current one, says so: the sandbox keeps the values it took (apply changes nothing
/// about that; only a new sandbox gets the template's current values).
async fn stale_template(
    client: &Client,
    server: Option<&Value>,
) -> Result<Option<String>, CliError> {
    let Some(name) = server.and_then(|s| s["status"]["template"]["name"].as_str()) else {
        return Ok(None);
    };
    let template = client.get_resource(Kind::SandboxTemplate, name).await?;
    Ok(server.and_then(|s| template_note(s, template.as_ref())))
}

/// The note of [`stale_template`], from the server's sandbox and its template (`None`: deleted).
pub fn template_note(server: &Value, template: Option<&Value>) -> Option<String> {
    let record = &server["status"]["template"];
    let name = record["name"].as_str()?;
    let made_from = record["generation"].as_u64()?;
    let Some(template) = template else {
        return Some(format!(
            "made from template {name} (generation {made_from}), which no longer exists; it \
             keeps the values it took"
        ));
    };
    let now = template["metadata"]["generation"].as_u64().unwrap_or(1);
    (now != made_from).then(|| {
        format!(
            "made from an older generation of template {name} ({made_from}; it is at {now} \
             now): it keeps the values it took, only new sandboxes get the current ones"
        )
    })
}

async fn check_with_server(client: &Client, doc: &Document, plan: &Plan) -> Result<(), CliError> {
    let kind = doc.resource.kind();
    let body = doc.resource.declaration().to_json();
    match plan {
        Plan::Unchanged => {}
        Plan::Create => {
            client.create_resource(kind, &body, true).await?;
        }
        Plan::Update(_) => {
            client
                .replace_resource(kind, &doc.resource.key(), &body, true)
                .await?;
        }
    }
    Ok(())
}

pub async fn diff(args: DiffArgs) -> Result<ExitCode, CliError> {
    let documents = read_all(&args.files)?;
    let client = Client::new(&args.connection)?;
    let mut differs = false;
    let mut failed = 0;
    for doc in &documents {
        let server = client
            .get_resource(doc.resource.kind(), &doc.resource.key())
            .await?;
        let plan = plan(server.as_ref(), &doc.resource);
        if let Err(e) = check_with_server(&client, doc, &plan).await {
            if let CliError::Client(c) = &e {
                if c.status().is_none() {
                    return Err(e);
                }
            }
            failed += 1;
            emit_err(&format!(
                "error: {}: apply would fail: {e}",
                doc.reference()
            ));
            continue;
        }
        differs |= plan != Plan::Unchanged;
        emit(&render(&doc.reference(), &plan));
        if let Some(note) = stale_template(&client, server.as_ref()).await? {
            emit(&format!("{}: {note}\n", doc.reference()));
        }
    }
    if failed > 0 {
        return Err(CliError::Reported(format!(
            "{failed} of {} resource(s) would not apply",
            documents.len()
        )));
    }
    Ok(if differs {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{
        Fork, ForkOverrides, ForkSpec, RollbackRequest, Sandbox, SandboxSource, SandboxSpec,
    };
    use serde_json::json;

    fn sandbox(spec: SandboxSpec) -> AnyResource {
        AnyResource::Sandbox(Sandbox::new("demo", spec))
    }

    fn base() -> SandboxSpec {
        SandboxSpec {
            image: Some("img:1".into()),
            cpus: Some(1.0),
            ..Default::default()
        }
    }

    fn server_of(r: &AnyResource, status: Value) -> Value {
        let mut v = r.to_json();
        v["status"] = status;
        v["metadata"]["resourceVersion"] = "3".into();
        v
    }

    #[test]
    fn an_older_template_generation_is_named() {
        let server = json!({"status": {"template": {"name": "t", "generation": 1, "spec": {}}}});
        let current = json!({"metadata": {"generation": 1}});
        assert_eq!(template_note(&server, Some(&current)), None);
        let edited = json!({"metadata": {"generation": 3}});
        let note = template_note(&server, Some(&edited)).unwrap();
        assert!(
            note.contains("older generation of template t (1; it is at 3"),
            "{note}"
        );
        assert!(template_note(&server, None)
            .unwrap()
            .contains("no longer exists"));
        assert_eq!(template_note(&json!({"status": {}}), Some(&edited)), None);
    }

    #[test]
    fn new_and_unchanged() {
        let r = sandbox(base());
        assert_eq!(plan(None, &r), Plan::Create);
        assert_eq!(plan(Some(&server_of(&r, json!({}))), &r), Plan::Unchanged);
    }

    #[test]
    fn limits_and_labels_apply_in_place() {
        let server = server_of(&sandbox(base()), json!({}));
        let mut wanted = Sandbox::new(
            "demo",
            SandboxSpec {
                cpus: Some(2.0),
                memory_mb: Some(1024),
                ..base()
            },
        );
        wanted.metadata.labels.insert("team".into(), "a".into());
        let p = plan(Some(&server), &AnyResource::Sandbox(wanted));
        let Plan::Update(changes) = &p else {
            panic!("{p:?}")
        };
        let fields: Vec<_> = changes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            ["metadata.labels.team", "spec.cpus", "spec.memoryMB"]
        );
        assert!(changes.iter().all(|c| c.impact == Impact::InPlace));
        assert_eq!(p.impact(), Some(Impact::InPlace));
        let text = render("sandbox/demo", &p);
        assert!(
            text.contains("spec.cpus") && text.contains("1.0 -> 2.0"),
            "{text}"
        );
    }

    #[test]
    fn egress_list_edits_apply_in_place_turning_it_on_replaces() {
        let with = |allow: &[&str]| SandboxSpec {
            network: Some(true),
            egress: Some(crate::resource::EgressSpec {
                allow: allow.iter().map(|s| s.to_string()).collect(),
            }),
            ..base()
        };
        let server = server_of(&sandbox(with(&["a.example"])), json!({}));
        let p = plan(Some(&server), &sandbox(with(&["a.example", "b.example"])));
        assert_eq!(p.impact(), Some(Impact::InPlace), "{p:?}");
        let open = SandboxSpec {
            network: Some(true),
            ..base()
        };
        let p = plan(Some(&server), &sandbox(open.clone()));
        assert_eq!(p.impact(), Some(Impact::ReplacesContainer), "{p:?}");
        let server = server_of(&sandbox(open), json!({}));
        let p = plan(Some(&server), &sandbox(with(&["a.example"])));
        assert_eq!(p.impact(), Some(Impact::ReplacesContainer), "{p:?}");
    }

    #[test]
    fn image_and_network_replace_the_container_env_applies_in_place() {
        let server = server_of(&sandbox(base()), json!({}));
        let mut env_only = base();
        env_only.env.insert("A".into(), "b".into());
        let p = plan(Some(&server), &sandbox(env_only.clone()));
        assert_eq!(p.impact(), Some(Impact::InPlace));
        let Plan::Update(changes) = &p else { panic!() };
        assert_eq!(changes[0].field, "spec.env.A");
        assert_eq!(changes[0].from, None);

        let spec = SandboxSpec {
            image: Some("img:2".into()),
            ..env_only
        };
        let p = plan(Some(&server), &sandbox(spec));
        assert_eq!(p.impact(), Some(Impact::ReplacesContainer));
        let text = render("sandbox/demo", &p);
        assert!(
            text.contains("state outside /workspace is lost, /workspace is kept"),
            "{text}"
        );
    }

    #[test]
    fn service_edits_apply_in_place_beside_a_replacing_change() {
        let with = |services: Value| {
            let mut spec = base();
            spec.services = serde_json::from_value(services).unwrap();
            spec
        };
        let server = server_of(
            &sandbox(with(json!([
                {"name": "a", "command": "exec sleep 1000"},
                {"name": "b", "command": "exec sleep 2000"},
            ]))),
            json!({}),
        );
        // One service's command edited, another added: in place, said in words.
        let edited = with(json!([
            {"name": "a", "command": "exec sleep 1000"},
            {"name": "b", "command": "exec sleep 3000"},
            {"name": "c", "command": "exec sleep 4000", "restartPolicy": "Never"},
        ]));
        let p = plan(Some(&server), &sandbox(edited.clone()));
        let Plan::Update(changes) = &p else {
            panic!("{p:?}")
        };
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].field, "spec.services");
        assert_eq!(changes[0].impact, Impact::InPlace);
        assert_eq!(p.impact(), Some(Impact::InPlace));
        let text = render("sandbox/demo", &p);
        assert!(
            text.contains("restarts only the services it changes, in the same container"),
            "{text}"
        );
        // Removing every service is in place too.
        let p = plan(Some(&server), &sandbox(base()));
        assert_eq!(p.impact(), Some(Impact::InPlace), "{p:?}");
        // Beside a new image the plan as a whole replaces the container.
        let p = plan(
            Some(&server),
            &sandbox(SandboxSpec {
                image: Some("img:2".into()),
                ..edited
            }),
        );
        assert_eq!(p.impact(), Some(Impact::ReplacesContainer), "{p:?}");
        let Plan::Update(changes) = &p else {
            panic!("{p:?}")
        };
        let services = changes.iter().find(|c| c.field == "spec.services").unwrap();
        assert_eq!(services.impact, Impact::InPlace);
    }

    #[test]
    fn source_is_immutable() {
        let server = server_of(&sandbox(base()), json!({}));
        let spec = SandboxSpec {
            source: Some(SandboxSource {
                snapshot: "s1".into(),
            }),
            ..base()
        };
        let p = plan(Some(&server), &sandbox(spec));
        assert_eq!(p.impact(), Some(Impact::Ignored));
        assert!(render("sandbox/demo", &p).contains("immutable"));
    }

    #[test]
    fn a_new_rollback_request_replaces_the_workspace_an_old_one_does_nothing() {
        let old = SandboxSpec {
            rollback: Some(RollbackRequest {
                snapshot: "s1".into(),
                request_id: "r1".into(),
            }),
            ..base()
        };
        let server = server_of(
            &sandbox(old),
            json!({"lastRollback": {"requestId": "r1", "snapshot": "s1", "completedAt": "2026-01-01T00:00:00Z"}}),
        );
        let new = SandboxSpec {
            rollback: Some(RollbackRequest {
                snapshot: "s1".into(),
                request_id: "r2".into(),
            }),
            ..base()
        };
        assert_eq!(
            plan(Some(&server), &sandbox(new)).impact(),
            Some(Impact::ReplacesWorkspace)
        );
        let same_id = SandboxSpec {
            rollback: Some(RollbackRequest {
                snapshot: "s2".into(),
                request_id: "r1".into(),
            }),
            ..base()
        };
        assert_eq!(
            plan(Some(&server), &sandbox(same_id)).impact(),
            Some(Impact::Ignored)
        );
    }

    #[test]
    fn snapshots_are_immutable_and_fork_scaling_down_deletes() {
        let snap = AnyResource::Snapshot(crate::resource::Snapshot::new(
            "s",
            crate::resource::SnapshotSpec {
                sandbox: "a".into(),
                display_name: None,
                scope: None,
            },
        ));
        let server = server_of(&snap, json!({}));
        let changed = AnyResource::Snapshot(crate::resource::Snapshot::new(
            "s",
            crate::resource::SnapshotSpec {
                sandbox: "b".into(),
                display_name: None,
                scope: None,
            },
        ));
        assert_eq!(
            plan(Some(&server), &changed).impact(),
            Some(Impact::Ignored)
        );

        let fork = |replicas, network| {
            AnyResource::Fork(Fork::new(
                "f",
                ForkSpec {
                    snapshot: "s".into(),
                    replicas,
                    overrides: ForkOverrides {
                        network,
                        ..Default::default()
                    },
                },
            ))
        };
        let server = server_of(&fork(3, None), json!({}));
        assert_eq!(
            plan(Some(&server), &fork(5, None)).impact(),
            Some(Impact::InPlace)
        );
        assert_eq!(
            plan(Some(&server), &fork(1, None)).impact(),
            Some(Impact::DeletesSandboxes)
        );
        assert_eq!(
            plan(Some(&server), &fork(3, Some(true))).impact(),
            Some(Impact::ReplacesContainer)
        );
    }
}
