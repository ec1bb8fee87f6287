//! The `/v1` routes in process, against a real store in a temporary directory: every refusal
//! (its status, code and message, in the reference server's order) and, with a stand-in for the
//! controller that writes the status a real one would, the shapes of the successful answers.
//! Behaviour against real Docker is covered by the SDK suite.

use agent_sandbox::metrics::{Exporter, Metrics};
use std::sync::Arc;
use std::time::Duration;

use agent_sandbox::api::auth::ApiKeys;
use agent_sandbox::api::v1::{routes_with, V1Options};
use agent_sandbox::api::AppState;
use agent_sandbox::config::Settings;
use agent_sandbox::dataplane::DataPlane;
use agent_sandbox::docker::fake::FakeEngine;
use agent_sandbox::docker::Engine;
use agent_sandbox::resource::{AnyResource, Kind};
use agent_sandbox::store::{Store, WriteOptions};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

struct App {
    router: Router,
    store: Arc<Store>,
    _dir: tempfile::TempDir,
}

fn app_with(wait: Duration, adjust: impl FnOnce(&mut Settings)) -> App {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut settings = Settings::for_tests(dir.path().to_path_buf());
    settings.default_image = "agent-sandbox-test/busybox:latest".into();
    settings.allowed_images = vec!["agent-sandbox-test/*".into()];
    adjust(&mut settings);
    let settings = Arc::new(settings);
    let routes = routes_with(&settings, V1Options { wait_timeout: wait });
    let store = Store::open(dir.path(), &[]).expect("store");
    let engine: Arc<dyn Engine> = Arc::new(FakeEngine::new());
    let engine_for_metrics = engine.clone();
    let state = AppState {
        settings: settings.clone(),
        store: store.clone(),
        dataplane: Arc::new(DataPlane::new(engine.clone(), settings.clone())),
        processes: Arc::new(agent_sandbox::processes::Processes::new(
            engine.clone(),
            settings.clone(),
        )),
        ports: Arc::new(agent_sandbox::ports::Ports::new(engine.clone(), &settings)),
        services: Arc::new(agent_sandbox::services::Services::new(
            Arc::new(agent_sandbox::processes::Processes::new(
                engine.clone(),
                settings.clone(),
            )),
            engine.clone(),
            settings.clone(),
            Arc::new(|_: &str| {}),
        )),
        engine,
        create_lock: Arc::new(tokio::sync::Mutex::new(())),
        keys: Arc::new(ApiKeys::disabled()),
        activity: Arc::default(),
        metrics: Arc::new(Exporter::new(
            Metrics::new(),
            store.clone(),
            engine_for_metrics,
            Box::new(|| 0),
        )),
        egress: None,
    };
    // As in the server, the routes sit behind the key check, which gives handlers the caller.
    let router = Router::from(routes)
        .route_layer(axum::middleware::from_fn_with_state(
            state.keys.clone(),
            agent_sandbox::api::auth::require_key,
        ))
        .with_state(state);
    App {
        router,
        store,
        _dir: dir,
    }
}

/// An app whose lifecycle calls give up quickly: no controller runs unless a test starts one.
fn app() -> App {
    app_with(Duration::from_millis(300), |_| {})
}

struct Answer {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// Asserts the common error shape and returns the message.
    fn error(&self, status: u16, code: &str) -> String {
        assert_eq!(
            self.status.as_u16(),
            status,
            "body: {}",
            String::from_utf8_lossy(&self.body)
        );
        let body = self.json();
        assert_eq!(body["error"]["code"], code, "{body}");
        assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");
        body["error"]["message"]
            .as_str()
            .expect("message")
            .to_string()
    }
}

async fn send(app: &App, request: Request<Body>) -> Answer {
    let response = app
        .router
        .clone()
        .oneshot(request)
        .await
        .expect("infallible");
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    Answer {
        status,
        content_type,
        body,
    }
}

async fn call(app: &App, method: &str, uri: &str, body: Option<&str>) -> Answer {
    let mut builder = Request::builder().method(method).uri(uri);
    if body.is_some() {
        builder = builder.header("content-type", "application/json");
    }
    let body = body.map(|b| Body::from(b.to_string())).unwrap_or_default();
    send(app, builder.body(body).expect("request")).await
}

async fn raw(
    app: &App,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Answer {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type {
        builder = builder.header("content-type", ct);
    }
    send(app, builder.body(Body::from(body)).expect("request")).await
}

// ---------------------------------------------------------------------------------------------
// A stand-in for the controller: it writes the status a real controller would, instantly.

fn controller(store: Arc<Store>) -> tokio::task::JoinHandle<()> {
    let mut events = store.subscribe();
    tokio::spawn(async move {
        // Catch up with what exists before the subscription, then follow events.
        for kind in [Kind::Sandbox, Kind::Snapshot] {
            for entry in store.list(kind) {
                reconcile(&store, &entry.resource);
            }
        }
        loop {
            match events.recv().await {
                Ok(event) => {
                    if let Some(entry) = store.get(event.resource.kind(), event.resource.name()) {
                        reconcile(&store, &entry.resource);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => return,
            }
        }
    })
}

fn reconcile(store: &Store, resource: &AnyResource) {
    let name = resource.name().to_string();
    if resource.metadata().deletion_timestamp.is_some() {
        let _ = store.finalize(resource.kind(), &name);
        return;
    }
    let generation = resource.metadata().generation.unwrap_or(0);
    match resource {
        AnyResource::Sandbox(sb) => {
            let status = sb.status.as_ref();
            if status.is_some_and(|s| s.observed_generation == Some(generation)) {
                return;
            }
            let image = sb.spec.image.clone().unwrap_or_default();
            let status = if image.contains("missing") {
                json!({
                    "phase": "Failed",
                    "observedGeneration": generation,
                    "message": format!("image {image} is not present on the docker host"),
                    "conditions": [{"type": "Ready", "status": "False", "reason": "ImageMissing",
                        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                })
            } else {
                let mut status = json!({
                    "phase": "Running",
                    "observedGeneration": generation,
                    "containerID": format!("fake-{name}"),
                });
                let source = sb
                    .spec
                    .rollback
                    .as_ref()
                    .map(|r| r.snapshot.clone())
                    .or_else(|| sb.spec.source.as_ref().map(|s| s.snapshot.clone()));
                if let Some(source) = source {
                    status["sourceSnapshot"] = json!(source);
                }
                if let Some(r) = &sb.spec.rollback {
                    status["lastRollback"] = json!({"requestId": r.request_id,
                        "snapshot": r.snapshot, "completedAt": "2026-01-01T00:00:00Z"});
                }
                status
            };
            let _ = store.update_status(Kind::Sandbox, &name, status);
        }
        AnyResource::Snapshot(snap) => {
            if snap.status.is_some() {
                return;
            }
            let source = store
                .get(Kind::Sandbox, &snap.spec.sandbox)
                .and_then(|e| e.resource.as_sandbox().cloned());
            let status = match source {
                Some(sb) if snap.spec.display_name.as_deref() == Some("huge") => json!({
                    "phase": "Failed",
                    "message": "the workspace is larger than the snapshot limit",
                    "conditions": [{"type": "Ready", "status": "False", "reason": "TooLarge",
                        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                    "sandboxSpec": serde_json::to_value(&sb.spec).unwrap_or_default(),
                }),
                Some(sb) => json!({
                    "phase": "Ready",
                    "sizeBytes": 10240,
                    "image": sb.spec.image,
                    "sandboxSpec": serde_json::to_value(&sb.spec).unwrap_or_default(),
                }),
                None => json!({"phase": "Failed", "message": "sandbox not found",
                    "conditions": [{"type": "Ready", "status": "False", "reason": "SandboxNotFound",
                        "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
            };
            let _ = store.update_status(Kind::Snapshot, &name, status);
        }
        AnyResource::Fork(_)
        | AnyResource::SandboxPool(_)
        | AnyResource::Secret(_)
        | AnyResource::Webhook(_)
        | AnyResource::SandboxTemplate(_)
        | AnyResource::ResourceQuota(_) => {}
    }
}

async fn running_sandbox(app: &App, body: &str) -> Value {
    let answer = call(app, "POST", "/v1/sandboxes", Some(body)).await;
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

fn is_timestamp(v: &Value) -> bool {
    let Some(s) = v.as_str() else { return false };
    let Some(rest) = s.strip_suffix('Z') else {
        return false;
    };
    let (main, fraction) = rest.split_once('.').unwrap_or((rest, ""));
    main.len() == 19
        && chrono::NaiveDateTime::parse_from_str(main, "%Y-%m-%dT%H:%M:%S").is_ok()
        && (fraction.is_empty()
            || (fraction.len() == 6 && fraction.bytes().all(|b| b.is_ascii_digit())))
}

// ---------------------------------------------------------------------------------------------
// Bodies that do not match the schema: 422 in the common shape.

#[tokio::test]
async fn malformed_bodies_are_422() {
    let app = app();
    let deep = "[".repeat(100_000);
    let cases: Vec<(Option<&str>, Vec<u8>, &str)> = vec![
        (
            Some("application/json"),
            b"{\"bogus\": 1}".to_vec(),
            "bogus",
        ),
        (
            Some("application/json"),
            b"{\"image\": 5}".to_vec(),
            "image",
        ),
        (
            Some("application/json"),
            b"{\"cpus\": \"abc\"}".to_vec(),
            "cpus",
        ),
        (
            Some("application/json"),
            b"{\"memory_mb\": 256.5}".to_vec(),
            "memory_mb",
        ),
        (
            Some("application/json"),
            b"{\"network\": \"maybe\"}".to_vec(),
            "network",
        ),
        (
            Some("application/json"),
            b"{\"network\": null}".to_vec(),
            "network",
        ),
        (
            Some("application/json"),
            b"{\"env\": {\"A\": 1}}".to_vec(),
            "env.A",
        ),
        (
            Some("application/json"),
            b"{\"cpus\": 0}".to_vec(),
            "greater than 0",
        ),
        (
            Some("application/json"),
            b"{\"memory_mb\": 8}".to_vec(),
            "greater than or equal to 16",
        ),
        (
            Some("application/json"),
            b"{\"memory_mb\": true}".to_vec(),
            "greater than or equal to 16",
        ),
        (
            Some("application/json"),
            b"{\"timeout_seconds\": 0}".to_vec(),
            "timeout_seconds",
        ),
        (Some("application/json"), b"{not json".to_vec(), "JSON"),
        (
            Some("application/json"),
            b"{\"timeout_seconds\": 60} x".to_vec(),
            "JSON",
        ),
        (Some("application/json"), b"null".to_vec(), "dictionary"),
        (Some("application/json"), b"[1]".to_vec(), "dictionary"),
        (Some("application/json"), b"".to_vec(), "required"),
        (Some("application/json"), deep.into_bytes(), "JSON"),
        (
            Some("application/json"),
            b"{\"image\": \"\xff\xfe\"}".to_vec(),
            "JSON",
        ),
        (None, b"{\"timeout_seconds\": 60}".to_vec(), "dictionary"),
        (
            Some("application/x-www-form-urlencoded"),
            b"{}".to_vec(),
            "dictionary",
        ),
        (Some("text/plain"), b"{}".to_vec(), "dictionary"),
    ];
    for (content_type, body, needle) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(40)]).to_string();
        let answer = raw(&app, "POST", "/v1/sandboxes", content_type, body).await;
        let message = answer.error(422, "validation_error");
        assert!(message.contains(needle), "{shown}: {message}");
    }
    // Every error is reported at once.
    let answer = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(r#"{"cpus": -1, "memory_mb": "x", "zzz": 1}"#),
    )
    .await;
    let message = answer.error(422, "validation_error");
    for needle in ["body.cpus", "body.memory_mb", "body.zzz"] {
        assert!(message.contains(needle), "{message}");
    }
    // JSON content types with parameters or a +json suffix are JSON.
    for ct in ["application/json; charset=utf-8", "application/vnd.x+json"] {
        let answer = raw(
            &app,
            "POST",
            "/v1/sandboxes",
            Some(ct),
            b"{\"bogus\": 1}".to_vec(),
        )
        .await;
        assert!(answer.error(422, "validation_error").contains("bogus"));
    }
    assert!(
        app.store.list(Kind::Sandbox).is_empty(),
        "nothing was written"
    );
}

#[tokio::test]
async fn the_other_bodies_refuse_unknown_fields_and_wrong_types() {
    let app = app();
    let cases = [
        (
            "/v1/sandboxes/sb_0000000000000000/exec",
            r#"{"command": "true", "shell": true}"#,
        ),
        (
            "/v1/sandboxes/sb_0000000000000000/exec",
            r#"{"cmd": "true"}"#,
        ),
        (
            "/v1/sandboxes/sb_0000000000000000/exec",
            r#"{"command": ["echo", 1]}"#,
        ),
        (
            "/v1/sandboxes/sb_0000000000000000/exec",
            r#"{"command": null}"#,
        ),
        (
            "/v1/sandboxes/sb_0000000000000000/exec",
            r#"{"command": {"a": 1}}"#,
        ),
        (
            "/v1/sandboxes/sb_0000000000000000/exec",
            r#"{"command": "true", "timeout_seconds": 0}"#,
        ),
        (
            "/v1/sandboxes/sb_0000000000000000/exec/stream",
            r#"{"command": "true", "x": 1}"#,
        ),
        ("/v1/sandboxes/sb_0000000000000000/timeout", r#"{}"#),
        (
            "/v1/sandboxes/sb_0000000000000000/timeout",
            r#"{"timeout_seconds": 0}"#,
        ),
        (
            "/v1/sandboxes/sb_0000000000000000/timeout",
            r#"{"timeout_seconds": 2.5}"#,
        ),
        (
            "/v1/sandboxes/sb_0000000000000000/snapshots",
            &format!(r#"{{"name": "{}"}}"#, "x".repeat(129)),
        ),
        (
            "/v1/sandboxes/sb_0000000000000000/snapshots",
            r#"{"name": 5}"#,
        ),
        (
            "/v1/sandboxes/sb_0000000000000000/snapshots",
            r#"{"label": "x"}"#,
        ),
        ("/v1/sandboxes/sb_0000000000000000/snapshots", r#"{"#),
        ("/v1/sandboxes/sb_0000000000000000/rollback", r#"{}"#),
        (
            "/v1/snapshots/snap_0000000000000000/fork",
            r#"{"pids_limit": 64}"#,
        ),
        (
            "/v1/snapshots/snap_0000000000000000/fork",
            r#"{"image": "x"}"#,
        ),
    ];
    for (uri, body) in cases {
        let answer = call(&app, "POST", uri, Some(body)).await;
        answer.error(422, "validation_error");
    }
}

// ---------------------------------------------------------------------------------------------
// The server's rules: 400, 403, 429.

#[tokio::test]
async fn settings_rules_answer_400_and_403_with_the_reference_messages() {
    let app = app_with(Duration::from_millis(300), |s| s.allow_network = false);
    let cases = [
        (
            r#"{"image": "python:3.12-slim"}"#,
            403,
            "forbidden",
            "image 'python:3.12-slim' is not in the server's allowed_images list",
        ),
        (
            r#"{"cpus": 5}"#,
            400,
            "invalid_request",
            "cpus must be in (0, 4.0]",
        ),
        (
            r#"{"memory_mb": 5000}"#,
            400,
            "invalid_request",
            "memory_mb must be in [16, 4096]",
        ),
        (
            r#"{"pids_limit": 5000}"#,
            400,
            "invalid_request",
            "pids_limit must be in [8, 4096]",
        ),
        (
            r#"{"timeout_seconds": 100000}"#,
            400,
            "invalid_request",
            "timeout_seconds must be in [1, 86400]",
        ),
        (
            r#"{"timeout_seconds": 100000000000000000000000000}"#,
            400,
            "invalid_request",
            "timeout_seconds must be in [1, 86400]",
        ),
        (
            r#"{"network": true}"#,
            403,
            "forbidden",
            "this server does not allow sandboxes with network access",
        ),
        (
            r#"{"env": {"A=B": "x"}}"#,
            400,
            "invalid_request",
            "invalid environment variable name 'A=B'",
        ),
        (
            r#"{"env": {"": "x"}}"#,
            400,
            "invalid_request",
            "invalid environment variable name ''",
        ),
        (
            r#"{"env": {"A": "x\u0000y"}}"#,
            400,
            "invalid_request",
            "invalid environment variable name 'A'",
        ),
        // The reference's order: the image is judged before the limits.
        (
            r#"{"image": "nope", "cpus": 5}"#,
            403,
            "forbidden",
            "image 'nope' is not in the server's allowed_images list",
        ),
    ];
    for (body, status, code, expected) in cases {
        let answer = call(&app, "POST", "/v1/sandboxes", Some(body)).await;
        assert_eq!(answer.error(status, code), expected, "{body}");
    }
    assert!(
        app.store.list(Kind::Sandbox).is_empty(),
        "nothing was written"
    );
}

#[tokio::test]
async fn max_sandboxes_holds_under_concurrent_creates() {
    // No controller: every accepted create times out waiting (503); the rest are refused (429).
    let app = Arc::new(app_with(Duration::from_secs(3), |s| s.max_sandboxes = 3));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let answer = call(&app, "POST", "/v1/sandboxes", Some("{}")).await;
            let status = answer.status.as_u16();
            let message = answer.error(
                status,
                if status == 429 {
                    "limit_exceeded"
                } else {
                    "unavailable"
                },
            );
            (status, message)
        }));
    }
    let mut refused = 0;
    let mut accepted = 0;
    for task in tasks {
        let (status, message) = task.await.expect("task");
        match status {
            429 => {
                assert_eq!(
                    message,
                    "the server already runs the maximum of 3 sandboxes"
                );
                refused += 1;
            }
            503 => {
                assert!(message.contains("timed out"), "{message}");
                accepted += 1;
            }
            other => panic!("unexpected {other}: {message}"),
        }
    }
    assert_eq!((accepted, refused), (3, 17));
    assert_eq!(
        app.store.list(Kind::Sandbox).len(),
        3,
        "exactly max_sandboxes were written"
    );
    // A create that timed out asked for its sandbox to be deleted again.
    assert!(app.store.list(Kind::Sandbox).iter().all(|e| e
        .resource
        .metadata()
        .deletion_timestamp
        .is_some()));
}

// ---------------------------------------------------------------------------------------------
// Unknown IDs: 404, and the checks the reference makes before looking.

#[tokio::test]
async fn unknown_ids_are_404_in_the_common_shape() {
    let app = app();
    let sb = "sb_0000000000000000";
    let missing = format!("sandbox {sb} not found");
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        ("GET", format!("/v1/sandboxes/{sb}"), None),
        ("DELETE", format!("/v1/sandboxes/{sb}"), None),
        (
            "POST",
            format!("/v1/sandboxes/{sb}/timeout"),
            Some(r#"{"timeout_seconds": 10}"#),
        ),
        (
            "POST",
            format!("/v1/sandboxes/{sb}/exec"),
            Some(r#"{"command": "true"}"#),
        ),
        (
            "POST",
            format!("/v1/sandboxes/{sb}/exec/stream"),
            Some(r#"{"command": "true"}"#),
        ),
        ("GET", format!("/v1/sandboxes/{sb}/files?path=a"), None),
        ("GET", format!("/v1/sandboxes/{sb}/files/list"), None),
        ("POST", format!("/v1/sandboxes/{sb}/snapshots"), None),
        ("GET", "/v1/sandboxes/whatever".to_string(), None),
    ];
    for (method, uri, body) in cases {
        let answer = call(&app, method, &uri, body).await;
        let message = answer.error(404, "not_found");
        assert!(message.starts_with("sandbox "), "{uri}: {message}");
        if uri.contains(sb) {
            assert_eq!(message, missing, "{uri}");
        }
    }
    let put = raw(
        &app,
        "PUT",
        &format!("/v1/sandboxes/{sb}/files?path=a"),
        None,
        b"x".to_vec(),
    )
    .await;
    assert_eq!(put.error(404, "not_found"), missing);

    let snap = "snap_0000000000000000";
    let snap_missing = format!("snapshot {snap} not found");
    for (method, uri, body) in [
        ("GET", format!("/v1/snapshots/{snap}"), None),
        ("DELETE", format!("/v1/snapshots/{snap}"), None),
        ("POST", format!("/v1/snapshots/{snap}/fork"), None),
        ("POST", format!("/v1/snapshots/{snap}/fork"), Some("{}")),
        // The snapshot is looked up before the sandbox.
        (
            "POST",
            format!("/v1/sandboxes/{sb}/rollback"),
            Some(r#"{"snapshot_id": "snap_0000000000000000"}"#),
        ),
    ] {
        let answer = call(&app, method, &uri, body).await;
        assert_eq!(answer.error(404, "not_found"), snap_missing, "{uri}");
    }
    let list = call(&app, "GET", "/v1/snapshots?sandbox_id=", None).await;
    assert_eq!(list.json(), json!({"snapshots": []}));
    let list = call(&app, "GET", "/v1/sandboxes", None).await;
    assert_eq!(list.json(), json!({"sandboxes": []}));
}

#[tokio::test]
async fn range_checks_come_before_the_lookup_where_the_reference_does_so() {
    let app = app();
    let answer = call(
        &app,
        "POST",
        "/v1/sandboxes/sb_0000000000000000/timeout",
        Some(r#"{"timeout_seconds": 100000}"#),
    )
    .await;
    assert_eq!(
        answer.error(400, "invalid_request"),
        "timeout_seconds must be in [1, 86400]"
    );
    // An oversized upload is refused before anything else is looked at.
    let answer = raw(
        &app,
        "PUT",
        "/v1/sandboxes/sb_0000000000000000/files?path=a",
        None,
        vec![b'x'; 52_428_801],
    )
    .await;
    assert_eq!(
        answer.error(413, "payload_too_large"),
        "file exceeds 52428800 bytes"
    );
    // Query validation comes first of all.
    let answer = raw(
        &app,
        "PUT",
        "/v1/sandboxes/sb_0000000000000000/files?path=a&mode=9",
        None,
        b"x".to_vec(),
    )
    .await;
    assert!(answer.error(422, "validation_error").contains("mode"));
    let answer = raw(
        &app,
        "PUT",
        "/v1/sandboxes/sb_0000000000000000/files",
        None,
        b"x".to_vec(),
    )
    .await;
    assert!(answer.error(422, "validation_error").contains("path"));
}

// ---------------------------------------------------------------------------------------------
// With a running sandbox (stand-in controller): exec and file validation, then the happy paths.

#[tokio::test]
async fn exec_and_file_requests_are_checked_before_the_data_plane() {
    let app = app_with(Duration::from_secs(5), |s| s.max_file_bytes = 2000);
    let _controller = controller(app.store.clone());
    let sb = running_sandbox(&app, "{}").await;
    let id = sb["id"].as_str().expect("id");
    let exec = format!("/v1/sandboxes/{id}/exec");
    for (body, expected) in [
        (r#"{"command": ""}"#, "command must not be empty"),
        (r#"{"command": "   "}"#, "command must not be empty"),
        (
            r#"{"command": []}"#,
            "command must be a non-empty string or list of strings",
        ),
        (
            r#"{"command": "true", "timeout_seconds": 4000}"#,
            "timeout_seconds must be in (0, 3600]",
        ),
        (
            r#"{"command": "true", "timeout_seconds": "inf"}"#,
            "timeout_seconds must be in (0, 3600]",
        ),
        (
            r#"{"command": "true", "env": {"A=B": "x"}}"#,
            "invalid environment variable name 'A=B'",
        ),
        (
            r#"{"command": "true", "env": {"A": "x\u0000y"}}"#,
            "invalid environment variable name 'A'",
        ),
        (
            r#"{"command": "true", "workdir": "a\u0000b"}"#,
            "path must be a non-empty string",
        ),
    ] {
        for uri in [exec.clone(), format!("{exec}/stream")] {
            let answer = call(&app, "POST", &uri, Some(body)).await;
            assert_eq!(
                answer.error(400, "invalid_request"),
                expected,
                "{uri} {body}"
            );
        }
    }
    let files = format!("/v1/sandboxes/{id}/files");
    for query in ["path=", "path=%00", "path=a%00b"] {
        let answer = call(&app, "GET", &format!("{files}?{query}"), None).await;
        assert_eq!(
            answer.error(400, "invalid_request"),
            "path must be a non-empty string",
            "{query}"
        );
        let answer = call(&app, "GET", &format!("{files}/list?{query}"), None).await;
        assert_eq!(
            answer.error(400, "invalid_request"),
            "path must be a non-empty string",
            "{query}"
        );
        let answer = raw(
            &app,
            "PUT",
            &format!("{files}?{query}"),
            None,
            b"x".to_vec(),
        )
        .await;
        assert_eq!(
            answer.error(400, "invalid_request"),
            "path must be a non-empty string",
            "{query}"
        );
    }
    let answer = call(&app, "GET", &files, None).await;
    assert!(answer.error(422, "validation_error").contains("path"));
    for path in [
        "%2Ftmp%2Fx",
        "%2Fworkspace",
        "%2Fworkspace%2F",
        "..%2Fetc%2Fpasswd",
    ] {
        let answer = raw(
            &app,
            "PUT",
            &format!("{files}?path={path}"),
            None,
            b"x".to_vec(),
        )
        .await;
        assert_eq!(
            answer.error(400, "invalid_request"),
            "writes are limited to files under /workspace",
            "{path}"
        );
    }
    for mode in ["7777", "1644"] {
        let answer = raw(
            &app,
            "PUT",
            &format!("{files}?path=x&mode={mode}"),
            None,
            b"x".to_vec(),
        )
        .await;
        assert_eq!(
            answer.error(400, "invalid_request"),
            "mode must be between 0 and 0o777"
        );
    }
    for mode in ["abc", "64", "8644"] {
        let answer = raw(
            &app,
            "PUT",
            &format!("{files}?path=x&mode={mode}"),
            None,
            b"x".to_vec(),
        )
        .await;
        answer.error(422, "validation_error");
    }
    // Over the limit by Content-Length, and by a streamed body without one.
    let answer = raw(
        &app,
        "PUT",
        &format!("{files}?path=big"),
        None,
        vec![b'x'; 2001],
    )
    .await;
    assert_eq!(
        answer.error(413, "payload_too_large"),
        "file exceeds 2000 bytes"
    );
    let chunks = futures::stream::iter(
        (0..3).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'x'; 1000]))),
    );
    let request = Request::builder()
        .method("PUT")
        .uri(format!("{files}?path=big"))
        .body(Body::from_stream(chunks))
        .expect("request");
    let answer = send(&app, request).await;
    assert_eq!(
        answer.error(413, "payload_too_large"),
        "file exceeds 2000 bytes"
    );
}

#[tokio::test]
async fn a_sandbox_that_is_not_running_refuses_exec() {
    let app = app();
    let created = app
        .store
        .create(
            agent_sandbox::resource::Sandbox::new("stopped", Default::default()).into(),
            WriteOptions::default(),
        )
        .expect("create");
    let _ = created;
    let answer = call(
        &app,
        "POST",
        "/v1/sandboxes/stopped/exec",
        Some(r#"{"command": "true"}"#),
    )
    .await;
    assert_eq!(
        answer.error(400, "invalid_request"),
        "sandbox stopped is not running"
    );
    let answer = call(&app, "GET", "/v1/sandboxes/stopped", None).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["status"], "stopped");
}

#[tokio::test]
async fn lifecycle_answers_have_the_reference_shapes() {
    let app = app_with(Duration::from_secs(5), |s| s.max_snapshot_bytes = 30000);
    let _controller = controller(app.store.clone());

    let lax = r#"{"cpus": "0.5", "memory_mb": "256", "pids_limit": 64.0, "network": 0,
        "read_only_rootfs": "no", "timeout_seconds": "600", "env": {"FOO": "bar"}}"#;
    let answer = call(&app, "POST", "/v1/sandboxes", Some(lax)).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(answer.content_type, "application/json");
    let sb = answer.json();
    let keys: Vec<&str> = sb
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = vec![
        "id",
        "status",
        "image",
        "cpus",
        "memory_mb",
        "pids_limit",
        "network",
        "read_only_rootfs",
        "created_at",
        "expires_at",
        "source_snapshot_id",
    ];
    expected.sort_unstable();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, expected);
    let id = sb["id"].as_str().expect("id").to_string();
    assert!(id.starts_with("sb_") && id.len() == 19, "{id}");
    assert_eq!(sb["status"], "running");
    assert_eq!(sb["image"], "agent-sandbox-test/busybox:latest");
    assert_eq!(
        (
            sb["cpus"].as_f64(),
            sb["memory_mb"].as_u64(),
            sb["pids_limit"].as_u64()
        ),
        (Some(0.5), Some(256), Some(64))
    );
    assert_eq!(
        (sb["network"].as_bool(), sb["read_only_rootfs"].as_bool()),
        (Some(false), Some(false))
    );
    assert!(
        is_timestamp(&sb["created_at"]) && is_timestamp(&sb["expires_at"]),
        "{sb}"
    );
    assert_eq!(sb["source_snapshot_id"], Value::Null);
    let created =
        chrono::DateTime::parse_from_rfc3339(sb["created_at"].as_str().unwrap_or("")).expect("ts");
    let expires =
        chrono::DateTime::parse_from_rfc3339(sb["expires_at"].as_str().unwrap_or("")).expect("ts");
    assert_eq!((expires - created).num_seconds(), 600);
    // Every value was written out, so that later changes of the defaults cannot alter it.
    let stored = app.store.get(Kind::Sandbox, &id).expect("stored");
    let spec = &stored.resource.as_sandbox().expect("sandbox").spec;
    assert_eq!(
        spec.image.as_deref(),
        Some("agent-sandbox-test/busybox:latest")
    );
    assert_eq!(
        (spec.cpus, spec.memory_mb, spec.pids_limit, spec.ttl_seconds),
        (Some(0.5), Some(256), Some(64), Some(600))
    );
    assert_eq!(
        (spec.network, spec.read_only_rootfs),
        (Some(false), Some(false))
    );

    let second = running_sandbox(&app, "{}").await;
    assert_eq!(
        second["cpus"].to_string(),
        "1.0",
        "floats print like Python"
    );
    let list = call(&app, "GET", "/v1/sandboxes", None).await.json();
    let ids: Vec<&Value> = list["sandboxes"]
        .as_array()
        .expect("list")
        .iter()
        .map(|s| &s["id"])
        .collect();
    assert_eq!(ids, vec![&sb["id"], &second["id"]]);
    assert_eq!(
        call(&app, "GET", &format!("/v1/sandboxes/{id}"), None)
            .await
            .json(),
        sb
    );

    // Timeout: expires_at is now + timeout, and GET agrees.
    let before = chrono::Utc::now();
    let answer = call(
        &app,
        "POST",
        &format!("/v1/sandboxes/{id}/timeout"),
        Some(r#"{"timeout_seconds": 3600}"#),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    let timed = answer.json();
    let expires = chrono::DateTime::parse_from_rfc3339(timed["expires_at"].as_str().unwrap_or(""))
        .expect("ts");
    let delta = (expires.to_utc() - before).num_seconds();
    assert!((3599..=3601).contains(&delta), "{delta}");
    assert_eq!(timed["created_at"], sb["created_at"]);
    let got = call(&app, "GET", &format!("/v1/sandboxes/{id}"), None)
        .await
        .json();
    assert_eq!(got["expires_at"], timed["expires_at"]);

    // Snapshots.
    let answer = call(
        &app,
        "POST",
        &format!("/v1/sandboxes/{id}/snapshots"),
        Some(r#"{"name": "working"}"#),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let snap = answer.json();
    let snap_id = snap["id"].as_str().expect("id").to_string();
    assert!(
        snap_id.starts_with("snap_") && snap_id.len() == 21,
        "{snap_id}"
    );
    assert_eq!(snap["sandbox_id"], json!(id));
    assert_eq!(snap["name"], "working");
    assert_eq!(snap["image"], "agent-sandbox-test/busybox:latest");
    assert_eq!(snap["size_bytes"], 10240);
    assert!(is_timestamp(&snap["created_at"]));
    assert_eq!(snap.as_object().map(|o| o.len()), Some(6));
    let unnamed = raw(
        &app,
        "POST",
        &format!("/v1/sandboxes/{id}/snapshots"),
        None,
        Vec::new(),
    )
    .await;
    assert_eq!(unnamed.status, StatusCode::CREATED);
    assert_eq!(unnamed.json()["name"], Value::Null);
    let answer = call(
        &app,
        "POST",
        &format!("/v1/sandboxes/{id}/snapshots"),
        Some(r#"{"name": "huge"}"#),
    )
    .await;
    assert_eq!(
        answer.error(413, "payload_too_large"),
        "workspace exceeds the snapshot limit of 30000 bytes"
    );
    let mine = call(&app, "GET", &format!("/v1/snapshots?sandbox_id={id}"), None)
        .await
        .json();
    assert_eq!(
        mine["snapshots"].as_array().map(Vec::len),
        Some(2),
        "the failed one is gone: {mine}"
    );
    assert_eq!(mine["snapshots"][0], snap);
    assert_eq!(
        call(&app, "GET", &format!("/v1/snapshots/{snap_id}"), None)
            .await
            .json(),
        snap
    );

    // Rollback keeps the sandbox and names the snapshot.
    let answer = call(
        &app,
        "POST",
        &format!("/v1/sandboxes/{id}/rollback"),
        Some(&format!(r#"{{"snapshot_id": "{snap_id}"}}"#)),
    )
    .await;
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let rolled = answer.json();
    assert_eq!(rolled["id"], json!(id));
    assert_eq!(rolled["source_snapshot_id"], json!(snap_id));
    assert_eq!(rolled["created_at"], sb["created_at"]);
    assert_eq!(rolled["expires_at"], timed["expires_at"]);

    // Fork: the captured spec plus overrides, a fresh lifetime, and range checks like create.
    let answer = call(
        &app,
        "POST",
        &format!("/v1/snapshots/{snap_id}/fork"),
        Some(r#"{"cpus": 10}"#),
    )
    .await;
    assert_eq!(
        answer.error(400, "invalid_request"),
        "cpus must be in (0, 4.0]"
    );
    let answer = call(
        &app,
        "POST",
        &format!("/v1/snapshots/{snap_id}/fork"),
        Some(r#"{"timeout_seconds": 120, "memory_mb": 128}"#),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let fork = answer.json();
    assert_ne!(fork["id"], json!(id));
    assert_eq!(
        (
            fork["cpus"].as_f64(),
            fork["memory_mb"].as_u64(),
            fork["pids_limit"].as_u64()
        ),
        (Some(0.5), Some(128), Some(64))
    );
    assert_eq!(fork["read_only_rootfs"], false);
    assert_eq!(fork["source_snapshot_id"], json!(snap_id));
    let created = chrono::DateTime::parse_from_rfc3339(fork["created_at"].as_str().unwrap_or(""))
        .expect("ts");
    let expires = chrono::DateTime::parse_from_rfc3339(fork["expires_at"].as_str().unwrap_or(""))
        .expect("ts");
    assert_eq!((expires - created).num_seconds(), 120);
    let plain = raw(
        &app,
        "POST",
        &format!("/v1/snapshots/{snap_id}/fork"),
        None,
        Vec::new(),
    )
    .await;
    assert_eq!(plain.status, StatusCode::CREATED);

    // Delete: 204 with no body; gone afterwards; its snapshots remain.
    let answer = call(&app, "DELETE", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    assert!(answer.body.is_empty());
    call(&app, "GET", &format!("/v1/sandboxes/{id}"), None)
        .await
        .error(404, "not_found");
    call(&app, "DELETE", &format!("/v1/sandboxes/{id}"), None)
        .await
        .error(404, "not_found");
    assert_eq!(
        call(&app, "GET", &format!("/v1/snapshots/{snap_id}"), None)
            .await
            .json(),
        snap
    );
    let answer = call(&app, "DELETE", &format!("/v1/snapshots/{snap_id}"), None).await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    call(&app, "GET", &format!("/v1/snapshots/{snap_id}"), None)
        .await
        .error(404, "not_found");
}

#[tokio::test]
async fn a_sandbox_that_fails_to_start_is_a_backend_error_and_is_removed() {
    let app = app_with(Duration::from_secs(5), |_| {});
    let _controller = controller(app.store.clone());
    let answer = call(
        &app,
        "POST",
        "/v1/sandboxes",
        Some(r#"{"image": "agent-sandbox-test/missing:1"}"#),
    )
    .await;
    assert_eq!(
        answer.error(502, "backend_error"),
        "image agent-sandbox-test/missing:1 is not present on the docker host"
    );
    // The stand-in controller finalizes deletions at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(app.store.list(Kind::Sandbox).is_empty());
}
