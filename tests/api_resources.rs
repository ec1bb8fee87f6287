//! The HTTP API in process: the real router and server over TCP, the real store in a temporary
//! data directory, and the in-memory fake Docker engine. Covers authentication, the error shapes
//! of unknown routes and methods, the resource API (JSON and YAML, dryRun, conflicts, folder
//! ownership, watch, validation errors, body limits, generated names), health and OpenAPI.

use agent_sandbox::metrics::{Exporter, Metrics};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sandbox::api::auth::{load_or_create_keys, ApiKeys, KEY_FILE};
use agent_sandbox::api::http::serve;
use agent_sandbox::api::{router, AppState};
use agent_sandbox::config::Settings;
use agent_sandbox::dataplane::DataPlane;
use agent_sandbox::docker::fake::FakeEngine;
use agent_sandbox::docker::Engine;
use agent_sandbox::resource::Kind;
use agent_sandbox::store::Store;
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const KEY: &str = "test-key-0123456789abcdef";
const API: &str = "/apis/agent-sandbox.io/v1";

struct Api {
    url: String,
    client: reqwest::Client,
    store: Arc<Store>,
    engine: Arc<FakeEngine>,
    data_dir: PathBuf,
    _tmp: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start_with(keys: ApiKeys, folder: Option<(&str, &str)>) -> Api {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let mut watch_dirs = Vec::new();
    if let Some((file, text)) = folder {
        let dir = tmp.path().join("gitops");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
        watch_dirs.push(dir);
    }
    let store = Store::open(&data_dir, &watch_dirs).unwrap();
    let settings = Arc::new(Settings::for_tests(data_dir.clone()));
    let engine = Arc::new(FakeEngine::new());
    let dyn_engine: Arc<dyn Engine> = engine.clone();
    let state = AppState {
        settings: settings.clone(),
        store: store.clone(),
        dataplane: Arc::new(DataPlane::new(dyn_engine.clone(), settings.clone())),
        processes: Arc::new(agent_sandbox::processes::Processes::new(
            dyn_engine.clone(),
            settings.clone(),
        )),
        services: Arc::new(agent_sandbox::services::Services::new(
            Arc::new(agent_sandbox::processes::Processes::new(
                dyn_engine.clone(),
                settings.clone(),
            )),
            dyn_engine.clone(),
            settings.clone(),
            Arc::new(|_: &str| {}),
        )),
        ports: Arc::new(agent_sandbox::ports::Ports::new(
            dyn_engine.clone(),
            &settings,
        )),
        engine: dyn_engine.clone(),
        create_lock: Arc::new(tokio::sync::Mutex::new(())),
        keys: Arc::new(keys),
        activity: Arc::default(),
        metrics: Arc::new(Exporter::new(
            Metrics::new(),
            store.clone(),
            dyn_engine,
            Box::new(|| 0),
        )),
        egress: None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, router(state), async {
        let _ = stopped.await;
    }));
    Api {
        url,
        client: reqwest::Client::new(),
        store,
        engine,
        data_dir,
        _tmp: tmp,
        _stop: stop,
    }
}

async fn start() -> Api {
    start_with(ApiKeys::new([KEY]), None).await
}

impl Api {
    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(KEY)
    }

    /// Sends and returns status, headers and the body as JSON (Null when not JSON).
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let response = request.send().await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.unwrap();
        (
            status,
            headers,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn post_json(&self, plural: &str, body: Value) -> (StatusCode, Value) {
        let (status, _, value) = self
            .send(
                self.request(Method::POST, &format!("{API}/{plural}"))
                    .json(&body),
            )
            .await;
        (status, value)
    }

    fn manifests(&self, plural: &str) -> Vec<PathBuf> {
        let dir = self.data_dir.join("manifests").join(plural);
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        files
    }
}

fn sandbox(name: &str) -> Value {
    json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
           "metadata": {"name": name, "labels": {"team": "research"}},
           "spec": {"image": "busybox", "cpus": 1.0}})
}

fn assert_error(value: &Value, code: &str) {
    assert_eq!(value["error"]["code"], code, "{value}");
    assert!(value["error"]["message"].is_string(), "{value}");
}

#[tokio::test]
async fn authentication_matrix() {
    let api = start().await;
    let list = format!("{}{API}/sandboxes", api.url);
    type Case = (&'static str, Vec<(&'static str, String)>, StatusCode);
    let cases: Vec<Case> = vec![
        ("missing", vec![], StatusCode::UNAUTHORIZED),
        (
            "empty authorization",
            vec![("authorization", String::new())],
            StatusCode::UNAUTHORIZED,
        ),
        (
            "empty bearer",
            vec![("authorization", "Bearer ".into())],
            StatusCode::UNAUTHORIZED,
        ),
        (
            "wrong key",
            vec![("authorization", "Bearer wrong-key-0123456789abc".into())],
            StatusCode::UNAUTHORIZED,
        ),
        (
            "key prefix",
            vec![("authorization", format!("Bearer {}", &KEY[..10]))],
            StatusCode::UNAUTHORIZED,
        ),
        (
            "wrong scheme",
            vec![("authorization", format!("Basic {KEY}"))],
            StatusCode::UNAUTHORIZED,
        ),
        (
            "no scheme",
            vec![("authorization", KEY.into())],
            StatusCode::UNAUTHORIZED,
        ),
        (
            "empty x-api-key",
            vec![("x-api-key", String::new())],
            StatusCode::UNAUTHORIZED,
        ),
        (
            "bearer",
            vec![("authorization", format!("Bearer {KEY}"))],
            StatusCode::OK,
        ),
        (
            "bearer any case, padded",
            vec![("authorization", format!("bEARER    {KEY}  "))],
            StatusCode::OK,
        ),
        ("x-api-key", vec![("X-API-Key", KEY.into())], StatusCode::OK),
        (
            "wrong bearer wins over a right x-api-key",
            vec![
                ("authorization", "Bearer wrong-key-0123456789abc".into()),
                ("x-api-key", KEY.into()),
            ],
            StatusCode::UNAUTHORIZED,
        ),
        (
            "another scheme falls through to x-api-key",
            vec![
                ("authorization", "Basic abc".into()),
                ("x-api-key", KEY.into()),
            ],
            StatusCode::OK,
        ),
    ];
    for (what, headers, expected) in cases {
        let mut request = api.client.get(&list);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let (status, headers, body) = api.send(request).await;
        assert_eq!(status, expected, "{what}: {body}");
        if expected == StatusCode::UNAUTHORIZED {
            assert_eq!(headers["www-authenticate"], "Bearer", "{what}");
            assert_eq!(
                body,
                json!({"error": {"code": "unauthorized", "message": "missing or invalid API key"}}),
                "{what}"
            );
        }
    }
    // Health and the OpenAPI document need no key.
    let (status, _, _) = api
        .send(api.client.get(format!("{}/healthz", api.url)))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = api
        .send(api.client.get(format!("{}/openapi.json", api.url)))
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_generated_key_file_is_private_and_survives_restarts() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let settings = Settings::for_tests(tmp.path().join("data"));
    let keys = load_or_create_keys(&settings).unwrap();
    let path = tmp.path().join("data").join(KEY_FILE);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let key = std::fs::read_to_string(&path).unwrap().trim().to_string();
    assert!(keys.verify(key.as_bytes()));
    // A restart reads the same key; the file is not rewritten.
    let again = load_or_create_keys(&settings).unwrap();
    assert!(again.verify(key.as_bytes()));
    assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), key);

    let api = start_with(again, None).await;
    let (status, _, _) = api
        .send(
            api.client
                .get(format!("{}{API}/sandboxes", api.url))
                .header("x-api-key", &key),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = api
        .send(
            api.client
                .get(format!("{}{API}/sandboxes", api.url))
                .bearer_auth(KEY),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn unknown_routes_and_wrong_methods_use_the_error_shape_without_a_key() {
    let api = start().await;
    let (status, _, body) = api.send(api.client.get(format!("{}/nope", api.url))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body,
        json!({"error": {"code": "not_found", "message": "Not Found"}})
    );
    let (status, _, body) = api
        .send(api.client.post(format!("{}/v1/nope", api.url)))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&body, "not_found");

    let (status, headers, body) = api
        .send(api.client.delete(format!("{}/healthz", api.url)))
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(
        body,
        json!({"error": {"code": "method_not_allowed", "message": "Method Not Allowed"}})
    );
    assert!(
        headers["allow"].to_str().unwrap().contains("GET"),
        "{headers:?}"
    );

    // Routing comes before authentication, as in the reference.
    let (status, headers, body) = api
        .send(api.client.post(format!("{}{API}/sandboxes/demo", api.url)))
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{body}");
    let allow = headers["allow"].to_str().unwrap().to_string();
    for method in ["GET", "PUT", "DELETE"] {
        assert!(allow.contains(method), "{allow}");
    }
    assert_error(&body, "method_not_allowed");

    // An unknown resource type is a 404 too (after authentication).
    let (status, _, body) = api
        .send(api.request(Method::GET, &format!("{API}/gadgets")))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("gadgets"));
}

#[tokio::test]
async fn create_get_list_replace_delete_in_json_and_yaml() {
    let api = start().await;
    let (status, created) = api.post_json("sandboxes", sandbox("demo")).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["metadata"]["name"], "demo");
    assert!(created["metadata"]["uid"].is_string(), "{created}");
    assert!(
        created["metadata"]["resourceVersion"].is_string(),
        "{created}"
    );
    assert_eq!(api.manifests("sandboxes").len(), 1);

    // A YAML body, answered in YAML.
    let yaml = "apiVersion: agent-sandbox.io/v1\nkind: Snapshot\nmetadata:\n  name: snap-one\nspec:\n  sandbox: demo\n";
    let response = api
        .request(Method::POST, &format!("{API}/snapshots"))
        .header("content-type", "application/yaml")
        .header("accept", "application/yaml")
        .body(yaml)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers()["content-type"], "application/yaml");
    let text = response.text().await.unwrap();
    assert!(text.contains("name: snap-one"), "{text}");
    assert!(text.contains("sandbox: demo"), "{text}");

    for content_type in ["application/x-yaml", "text/yaml"] {
        let name = format!("from-{}", content_type.replace('/', "-"));
        let body = format!("apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: {name}\nspec: {{}}\n");
        let (status, _, value) = api
            .send(
                api.request(Method::POST, &format!("{API}/sandboxes"))
                    .header("content-type", content_type)
                    .body(body),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{content_type}: {value}");
        assert_eq!(value["metadata"]["name"], name.as_str());
    }

    let (status, _, got) = api
        .send(api.request(Method::GET, &format!("{API}/sandboxes/demo")))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got["spec"]["image"], "busybox");
    let response = api
        .request(Method::GET, &format!("{API}/sandboxes/demo"))
        .header("accept", "application/yaml")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["content-type"], "application/yaml");
    assert!(response.text().await.unwrap().contains("image: busybox"));

    let (status, _, list) = api
        .send(api.request(Method::GET, &format!("{API}/sandboxes")))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["kind"], "SandboxList");
    assert_eq!(list["items"].as_array().unwrap().len(), 3);
    let (_, _, selected) = api
        .send(api.request(
            Method::GET,
            &format!("{API}/sandboxes?labelSelector=team%3Dresearch"),
        ))
        .await;
    let names: Vec<&str> = selected["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["demo"]);

    // Replace: the spec changes, generation follows.
    let mut changed = got.clone();
    changed["spec"]["cpus"] = json!(2.0);
    let (status, _, replaced) = api
        .send(
            api.request(Method::PUT, &format!("{API}/sandboxes/demo"))
                .json(&changed),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{replaced}");
    assert_eq!(replaced["spec"]["cpus"], 2.0);
    assert!(replaced["metadata"]["generation"].as_u64() > got["metadata"]["generation"].as_u64());

    // The name in the body must match the URL.
    let (status, _, body) = api
        .send(
            api.request(Method::PUT, &format!("{API}/sandboxes/other"))
                .json(&changed),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_error(&body, "invalid_request");

    let (status, _, deleted) = api
        .send(api.request(Method::DELETE, &format!("{API}/sandboxes/demo?wait=false")))
        .await;
    assert!(
        status == StatusCode::ACCEPTED || status == StatusCode::OK,
        "{status}"
    );
    assert!(
        deleted["metadata"]["deletionTimestamp"].is_string(),
        "{deleted}"
    );

    let (status, _, body) = api
        .send(api.request(Method::GET, &format!("{API}/sandboxes/missing")))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&body, "not_found");

    // Creating a name twice is a conflict.
    let (status, body) = api
        .post_json(
            "snapshots",
            json!({"apiVersion": "agent-sandbox.io/v1",
        "kind": "Snapshot", "metadata": {"name": "snap-one"}, "spec": {"sandbox": "demo"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_error(&body, "conflict");
}

#[tokio::test]
async fn dry_run_writes_nothing() {
    let api = start().await;
    let (status, _, would) = api
        .send(
            api.request(Method::POST, &format!("{API}/sandboxes?dryRun=All"))
                .json(&sandbox("dry")),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{would}");
    assert_eq!(would["metadata"]["name"], "dry");
    assert!(api.manifests("sandboxes").is_empty());
    assert!(api.store.get(Kind::Sandbox, "dry").is_none());
    let (status, _, _) = api
        .send(api.request(Method::GET, &format!("{API}/sandboxes/dry")))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Dry-run replace and delete of a real resource change nothing either.
    let (_, created) = api.post_json("sandboxes", sandbox("real")).await;
    let manifest = api.manifests("sandboxes");
    let before = std::fs::read(&manifest[0]).unwrap();
    let mut changed = created.clone();
    changed["spec"]["cpus"] = json!(3.0);
    let (status, _, would) = api
        .send(
            api.request(Method::PUT, &format!("{API}/sandboxes/real?dryRun=All"))
                .json(&changed),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{would}");
    assert_eq!(would["spec"]["cpus"], 3.0);
    let (status, _, _) = api
        .send(api.request(Method::DELETE, &format!("{API}/sandboxes/real?dryRun=All")))
        .await;
    assert!(status.is_success());
    assert_eq!(std::fs::read(&manifest[0]).unwrap(), before);
    let (_, _, now) = api
        .send(api.request(Method::GET, &format!("{API}/sandboxes/real")))
        .await;
    assert_eq!(now["spec"]["cpus"], 1.0);
    assert!(now["metadata"]["deletionTimestamp"].is_null());
    assert_eq!(
        now["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );

    let (status, _, body) = api
        .send(
            api.request(Method::POST, &format!("{API}/sandboxes?dryRun=Some"))
                .json(&sandbox("x")),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict() {
    let api = start().await;
    let (_, created) = api.post_json("sandboxes", sandbox("cas")).await;
    let mut first = created.clone();
    first["spec"]["cpus"] = json!(2.0);
    let (status, _, _) = api
        .send(
            api.request(Method::PUT, &format!("{API}/sandboxes/cas"))
                .json(&first),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // Same (now stale) resourceVersion again.
    let mut second = created.clone();
    second["spec"]["cpus"] = json!(3.0);
    let (status, _, body) = api
        .send(
            api.request(Method::PUT, &format!("{API}/sandboxes/cas"))
                .json(&second),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_error(&body, "conflict");
}

#[tokio::test]
async fn changing_an_immutable_field_is_422_naming_it() {
    let api = start().await;
    let put = |plural: &'static str, name: &'static str, body: Value| {
        let request = api
            .request(Method::PUT, &format!("{API}/{plural}/{name}"))
            .json(&body);
        async { api.send(request).await }
    };
    let snapshot = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Snapshot",
        "metadata": {"name": "snap"}, "spec": {"sandbox": "a"}});
    let (status, created) = api.post_json("snapshots", snapshot).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");

    let mut changed = created.clone();
    changed["spec"]["sandbox"] = json!("b");
    let (status, _, body) = put("snapshots", "snap", changed.clone()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_error(&body, "validation_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("spec.sandbox: field is immutable"),
        "{message}"
    );
    // A dry run is refused the same way.
    let request = api
        .request(Method::PUT, &format!("{API}/snapshots/snap?dryRun=All"))
        .json(&changed);
    let (status, _, _) = api.send(request).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    // Every field of a snapshot's spec is immutable; labels are not.
    let mut changed = created.clone();
    changed["spec"]["displayName"] = json!("renamed");
    let (status, _, body) = put("snapshots", "snap", changed).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("spec.displayName: field is immutable"));
    let mut labelled = created.clone();
    labelled["metadata"]["labels"] = json!({"keep": "yes"});
    let (status, _, body) = put("snapshots", "snap", labelled).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stored = api.store.get(Kind::Snapshot, "snap").unwrap();
    assert_eq!(stored.resource.as_snapshot().unwrap().spec.sandbox, "a");
    assert_eq!(
        stored.resource.as_snapshot().unwrap().spec.display_name,
        None
    );

    // A sandbox's source is immutable, its other fields are not.
    let mut forked = sandbox("forked");
    forked["spec"]["source"] = json!({"snapshot": "snap"});
    let (status, created) = api.post_json("sandboxes", forked).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    for source in [json!({"snapshot": "other"}), Value::Null] {
        let mut changed = created.clone();
        changed["spec"]["source"] = source;
        let (status, _, body) = put("sandboxes", "forked", changed).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.source: field is immutable"));
    }
    let mut changed = created.clone();
    changed["spec"]["cpus"] = json!(2.0);
    let (status, _, body) = put("sandboxes", "forked", changed).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["spec"]["source"]["snapshot"], "snap");
    // Adding a source to a sandbox made without one is a change too.
    let (_, plain) = api.post_json("sandboxes", sandbox("plain")).await;
    let mut changed = plain.clone();
    changed["spec"]["source"] = json!({"snapshot": "snap"});
    let (status, _, _) = put("sandboxes", "plain", changed).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

const FOLDER_SANDBOX: &str = "\
apiVersion: agent-sandbox.io/v1
kind: Sandbox
metadata:
  name: from-git
spec:
  image: busybox
---
apiVersion: agent-sandbox.io/v1
kind: Sandbox
metadata:
  name: broken
spec:
  image: busybox
  cpus: -2
";

#[tokio::test]
async fn folder_owned_resources_are_read_only_and_bad_documents_are_reported() {
    let api = start_with(ApiKeys::new([KEY]), Some(("team.yaml", FOLDER_SANDBOX))).await;
    let folder = api.data_dir.parent().unwrap().join("gitops");
    let (status, _, got) = api
        .send(api.request(Method::GET, &format!("{API}/sandboxes/from-git")))
        .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let mut changed = got.clone();
    changed["spec"]["cpus"] = json!(2.0);
    let (status, _, body) = api
        .send(
            api.request(Method::PUT, &format!("{API}/sandboxes/from-git"))
                .json(&changed),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_error(&body, "forbidden");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&folder.display().to_string()), "{message}");
    let (status, _, body) = api
        .send(api.request(Method::DELETE, &format!("{API}/sandboxes/from-git")))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    let (status, _, errors) = api
        .send(api.request(Method::GET, &format!("{API}/errors")))
        .await;
    assert_eq!(status, StatusCode::OK);
    let errors = errors["errors"].as_array().unwrap().clone();
    assert_eq!(errors.len(), 1, "{errors:?}");
    let e = &errors[0];
    assert!(e["file"].as_str().unwrap().ends_with("team.yaml"), "{e}");
    assert_eq!(e["line"], 14, "{e}");
    assert_eq!(e["field"], "spec.cpus", "{e}");
    assert_eq!(e["kind"], "Sandbox", "{e}");
    assert_eq!(e["name"], "broken", "{e}");
}

/// Reads NDJSON lines from a watch until `count` lines arrived.
async fn read_lines(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buffer: &mut Vec<u8>,
    count: usize,
) -> Vec<Value> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < count {
        while let Some(pos) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=pos).collect();
            out.push(serde_json::from_slice(&line).unwrap());
            if out.len() == count {
                return out;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, stream.next())
            .await
            .expect("watch event in time")
            .expect("stream open")
            .unwrap();
        buffer.extend_from_slice(&chunk);
    }
    out
}

#[tokio::test]
async fn watch_streams_added_modified_deleted() {
    let api = start().await;
    api.post_json("sandboxes", sandbox("before")).await;
    api.post_json(
        "snapshots",
        json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Snapshot",
        "metadata": {"name": "other-kind"}, "spec": {"sandbox": "before"}}),
    )
    .await;
    let response = api
        .request(Method::GET, &format!("{API}/sandboxes?watch=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();
    let first = read_lines(&mut stream, &mut buffer, 1).await;
    assert_eq!(first[0]["type"], "ADDED");
    assert_eq!(first[0]["object"]["metadata"]["name"], "before");

    let (_, created) = api.post_json("sandboxes", sandbox("live")).await;
    let mut changed = created.clone();
    changed["spec"]["cpus"] = json!(2.0);
    api.send(
        api.request(Method::PUT, &format!("{API}/sandboxes/live"))
            .json(&changed),
    )
    .await;
    api.send(api.request(Method::DELETE, &format!("{API}/sandboxes/live?wait=false")))
        .await;
    // The controller's part of deletion: finishing it removes the resource.
    api.store.finalize(Kind::Sandbox, "live").unwrap();

    let events = read_lines(&mut stream, &mut buffer, 4).await;
    let seen: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    let live = |t: &str| (t.to_string(), "live".to_string());
    assert_eq!(
        seen,
        [
            live("ADDED"),
            live("MODIFIED"),
            live("MODIFIED"),
            live("DELETED")
        ],
        "{events:?}"
    );
    assert_eq!(events[1]["object"]["spec"]["cpus"], 2.0);
    assert!(events[2]["object"]["metadata"]["deletionTimestamp"].is_string());
}

#[tokio::test]
async fn a_bad_yaml_body_is_422_naming_field_and_line() {
    let api = start().await;
    let body = "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: bad\nspec:\n  image: busybox\n  memoryMB: lots\n";
    let (status, _, value) = api
        .send(
            api.request(Method::POST, &format!("{API}/sandboxes"))
                .header("content-type", "application/yaml")
                .body(body),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{value}");
    assert_error(&value, "validation_error");
    let message = value["error"]["message"].as_str().unwrap();
    assert!(message.contains("spec.memoryMB"), "{message}");
    assert!(message.contains("line 7"), "{message}");

    let unknown = body.replace("memoryMB: lots", "privileged: true");
    let (status, _, value) = api
        .send(
            api.request(Method::POST, &format!("{API}/sandboxes"))
                .header("content-type", "text/yaml")
                .body(unknown),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{value}");
    assert!(
        value["error"]["message"]
            .as_str()
            .unwrap()
            .contains("privileged"),
        "{value}"
    );

    // JSON declared but not sent; and a type that is neither.
    let (status, _, value) = api
        .send(
            api.request(Method::POST, &format!("{API}/sandboxes"))
                .header("content-type", "application/json")
                .body("kind: Sandbox\n"),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{value}");
    let (status, _, value) = api
        .send(
            api.request(Method::POST, &format!("{API}/sandboxes"))
                .header("content-type", "text/plain")
                .body(body),
        )
        .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{value}");
    assert!(api.manifests("sandboxes").is_empty());
}

#[tokio::test]
async fn bodies_over_one_mib_are_413_quickly() {
    let api = start().await;
    let mut doc = sandbox("big");
    doc["metadata"]["annotations"] = json!({"padding": "x".repeat(2 * 1024 * 1024)});
    let started = Instant::now();
    let (status, _, value) = api
        .send(
            api.request(Method::POST, &format!("{API}/sandboxes"))
                .json(&doc),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{value}");
    assert_error(&value, "payload_too_large");
    assert!(started.elapsed() < Duration::from_secs(5));

    // Without a Content-Length the limit holds while reading.
    let chunks = futures::stream::iter(
        (0..40).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; 64 * 1024]))),
    );
    let started = Instant::now();
    let (status, _, value) = api
        .send(
            api.request(Method::POST, &format!("{API}/sandboxes"))
                .header("content-type", "application/json")
                .body(reqwest::Body::wrap_stream(chunks)),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{value}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(api.manifests("sandboxes").is_empty());
}

#[tokio::test]
async fn a_sandbox_without_a_name_gets_a_generated_one() {
    let api = start().await;
    let body = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox", "spec": {}});
    let mut names = std::collections::BTreeSet::new();
    for _ in 0..3 {
        let (status, created) = api.post_json("sandboxes", body.clone()).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        let name = created["metadata"]["name"].as_str().unwrap().to_string();
        let hex = name.strip_prefix("sb_").unwrap_or_else(|| panic!("{name}"));
        assert_eq!(hex.len(), 16, "{name}");
        assert!(
            hex.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{name}"
        );
        names.insert(name);
    }
    assert_eq!(names.len(), 3);
}

#[tokio::test]
async fn health_reports_docker() {
    let api = start().await;
    let (status, _, body) = api
        .send(api.client.get(format!("{}/healthz", api.url)))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        json!({"status": "ok", "backend": "docker", "version": env!("CARGO_PKG_VERSION")})
    );
    api.engine.set_unreachable(true);
    let (status, _, body) = api
        .send(api.client.get(format!("{}/healthz", api.url)))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_error(&body, "backend_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .to_lowercase()
        .contains("docker"));
}

#[tokio::test]
async fn the_served_openapi_document_is_the_committed_one() {
    let api = start().await;
    let (status, headers, served) = api
        .send(api.client.get(format!("{}/openapi.json", api.url)))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        served, committed,
        "docs/openapi.json is stale: run `agent-sandbox openapi docs/openapi.json`"
    );
    assert_eq!(served["openapi"], "3.1.0");
    for path in [
        "/healthz",
        "/apis/agent-sandbox.io/v1/sandboxes/{name}",
        "/v1/sandboxes",
    ] {
        assert!(served["paths"][path].is_object(), "{path} missing");
    }
}

#[tokio::test]
async fn a_trailing_slash_redirects_to_the_route_without_a_key() {
    let api = start().await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let host = api.url.trim_start_matches("http://");
    for (path, location) in [
        ("/v1/sandboxes/", format!("http://{host}/v1/sandboxes")),
        (
            "/apis/agent-sandbox.io/v1/sandboxes/demo/?dryRun=All",
            format!("http://{host}/apis/agent-sandbox.io/v1/sandboxes/demo?dryRun=All"),
        ),
    ] {
        let response = client
            .get(format!("{}{path}", api.url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT, "{path}");
        assert_eq!(response.headers()["location"], location.as_str());
    }
    let response = client
        .get(format!("{}/nothing/", api.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_json_body_limit_leaves_file_uploads_alone() {
    let api = start().await;
    // Larger than the 1 MiB JSON limit, smaller than the file limit: the upload route answers
    // for the unknown sandbox instead of refusing the size.
    let (status, _, body) = api
        .send(
            api.request(
                Method::PUT,
                "/v1/sandboxes/sb_0000000000000000/files?path=big.bin",
            )
            .header("content-type", "application/octet-stream")
            .body(vec![b'x'; 2 * 1024 * 1024]),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_error(&body, "not_found");
}

/// The document is the router's own description (every route is registered together with its
/// operation); this checks the result from outside, both ways: every documented operation reaches
/// a handler, not the router's 404 or 405, and every other method on a documented path is 405,
/// so nothing on those paths is routed without being documented.
#[tokio::test]
async fn every_documented_operation_is_routed() {
    let api = start().await;
    let document = agent_sandbox::api::default_openapi_document();
    let paths = document["paths"].as_object().unwrap();
    assert!(paths.len() > 20);
    for (path, item) in paths {
        // Names no object has: handlers answer their own 404 (or another 4xx) for them.
        let concrete = path
            .replace("{namespace}", "team-a")
            .replace("{name}", "no-such-object")
            .replace("{id}", "sb_0000000000000000");
        let documented: Vec<Method> = item
            .as_object()
            .unwrap()
            .keys()
            .map(|method| method.to_uppercase().parse().unwrap())
            .collect();
        for method in [
            Method::GET,
            Method::PUT,
            Method::POST,
            Method::DELETE,
            Method::PATCH,
        ] {
            let (status, _, body) = api
                .send(
                    api.request(method.clone(), &concrete)
                        .header("content-type", "application/json")
                        .body("{"),
                )
                .await;
            if documented.contains(&method) {
                assert_ne!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is documented but not routed"
                );
                assert!(
                    !(status == StatusCode::NOT_FOUND && body["error"]["message"] == "Not Found"),
                    "{method} {path} is documented but reaches the router's fallback"
                );
            } else {
                assert_eq!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is routed but not documented: {body}"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_watch_with_timeout_seconds_ends_by_itself() {
    let api = start().await;
    let (status, _) = api.post_json("sandboxes", sandbox("watched")).await;
    assert_eq!(status, StatusCode::CREATED);
    let started = Instant::now();
    let response = api
        .request(
            Method::GET,
            &format!("{API}/sandboxes?watch=true&timeoutSeconds=1"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let text = tokio::time::timeout(Duration::from_secs(10), response.text())
        .await
        .expect("the watch ended")
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(900));
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["metadata"]["name"], "watched");
    for bad in ["0", "x", "4294967296"] {
        let (status, _, body) = api
            .send(api.request(
                Method::GET,
                &format!("{API}/sandboxes?watch=true&timeoutSeconds={bad}"),
            ))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("timeoutSeconds"));
    }
}

#[tokio::test]
async fn a_merge_patch_changes_only_what_it_names_and_is_validated_as_a_put() {
    let api = start().await;
    let (status, created) = api.post_json("sandboxes", sandbox("patched")).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let patch = |body: &str, content_type: &str| {
        let request = api
            .request(Method::PATCH, &format!("{API}/sandboxes/patched"))
            .header("content-type", content_type)
            .body(body.to_string());
        async { api.send(request).await }
    };
    const MERGE: &str = "application/merge-patch+json";

    let (status, _, body) = patch(
        r#"{"metadata": {"labels": {"team": null, "tier": "gold"}},
            "spec": {"state": "Paused", "cpus": 2}}"#,
        MERGE,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["spec"]["state"], "Paused");
    assert_eq!(body["spec"]["cpus"], 2.0);
    assert_eq!(body["spec"]["image"], "busybox", "untouched fields stay");
    assert_eq!(body["metadata"]["labels"], json!({"tier": "gold"}));
    assert_eq!(body["metadata"]["generation"], 2);

    // Unknown fields are named; invalid values too; nothing is written.
    let (status, _, body) = patch(r#"{"spec": {"stat": "Paused"}}"#, MERGE).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("stat"),
        "{body}"
    );
    let (status, _, body) = patch(r#"{"spec": {"state": "Asleep"}}"#, MERGE).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.state"),
        "{body}"
    );
    // Immutable fields as for PUT.
    let (status, _, body) = patch(r#"{"spec": {"source": {"snapshot": "s"}}}"#, MERGE).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.source"),
        "{body}"
    );
    // A stale resourceVersion is a conflict; the wrong media type is 415; a rename is refused.
    let (status, _, body) = patch(r#"{"metadata": {"resourceVersion": "1"}}"#, MERGE).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, _, _) = patch(r#"{"spec": {"cpus": 3}}"#, "application/json").await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, _, _) = patch(r#"{"metadata": {"name": "other"}}"#, MERGE).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (_, _, got) = api
        .send(api.request(Method::GET, &format!("{API}/sandboxes/patched")))
        .await;
    assert_eq!(got["spec"]["cpus"], 2.0);
    assert_eq!(
        got["metadata"]["generation"], 2,
        "the refused patches wrote nothing"
    );

    // Every kind takes a patch.
    let snapshot = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Snapshot",
        "metadata": {"name": "snap"}, "spec": {"sandbox": "patched"}});
    let (status, _) = api.post_json("snapshots", snapshot).await;
    assert_eq!(status, StatusCode::CREATED);
    let request = api
        .request(Method::PATCH, &format!("{API}/snapshots/snap"))
        .header("content-type", MERGE)
        .body(r#"{"metadata": {"labels": {"keep": "yes"}}}"#);
    let (status, _, body) = api.send(request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["metadata"]["labels"]["keep"], "yes");
}

#[tokio::test]
async fn pause_takes_only_a_known_mode() {
    let api = start().await;
    let (status, _) = api.post_json("sandboxes", sandbox("p")).await;
    assert_eq!(status, StatusCode::CREATED);
    let pause = |body: Value| {
        let request = api
            .request(Method::POST, &format!("{API}/sandboxes/p/pause"))
            .json(&body);
        async { api.send(request).await }
    };
    let (status, _, body) = pause(json!({"mode": "Frozen"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, _, body) = pause(json!({"mood": "Paused"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("mood"),
        "{body}"
    );
    let (status, _, body) = api
        .send(api.request(Method::POST, &format!("{API}/sandboxes/missing/resume")))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // Nothing was written by the refusals.
    let (_, _, got) = api
        .send(api.request(Method::GET, &format!("{API}/sandboxes/p")))
        .await;
    assert!(got["spec"].get("state").is_none(), "{got}");
}

#[tokio::test]
async fn a_resource_type_the_server_does_not_have_is_404_naming_the_kinds() {
    let api = start().await;
    for (method, path) in [
        (Method::GET, format!("{API}/widgets")),
        (Method::POST, format!("{API}/widgets")),
        (Method::DELETE, format!("{API}/widgets/w1")),
    ] {
        let (status, _, body) = api.send(api.request(method.clone(), &path)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_error(&body, "not_found");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("\"widgets\""), "{message}");
        for kind in ["sandboxes", "snapshots", "forks", "sandboxpools"] {
            assert!(message.contains(kind), "{message}");
        }
    }
}

#[tokio::test]
async fn a_list_with_limit_comes_in_pages_joined_by_continue() {
    let api = start().await;
    for i in 0..7 {
        let (status, body) = api
            .post_json("sandboxes", sandbox(&format!("page-{i}")))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let names = |list: &Value| -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, _, all) = api
        .send(api.request(Method::GET, &format!("{API}/sandboxes")))
        .await;
    assert!(all.get("metadata").is_none(), "{all}");
    let everything = names(&all);
    assert_eq!(everything.len(), 7);

    // Pages of three: 3 + 3 + 1, in the list's order, each saying what remains.
    let mut paged = Vec::new();
    let mut token: Option<String> = None;
    let mut remaining = Vec::new();
    loop {
        let query = match &token {
            Some(t) => format!("?limit=3&continue={t}"),
            None => "?limit=3".to_string(),
        };
        let (status, _, page) = api
            .send(api.request(Method::GET, &format!("{API}/sandboxes{query}")))
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(page["kind"], "SandboxList");
        paged.extend(names(&page));
        remaining.push(page["metadata"]["remainingItemCount"].as_u64().unwrap());
        match page["metadata"]["continue"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    assert_eq!(paged, everything);
    assert_eq!(remaining, [4, 1, 0]);

    // A page whose last object was deleted since still resumes after it.
    let (_, _, first) = api
        .send(api.request(Method::GET, &format!("{API}/sandboxes?limit=2")))
        .await;
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    let last = names(&first)[1].clone();
    let (status, _, _) = api
        .send(api.request(
            Method::DELETE,
            &format!("{API}/sandboxes/{last}?wait=false"),
        ))
        .await;
    assert!(status.is_success(), "{status}");
    let (_, _, rest) = api
        .send(api.request(
            Method::GET,
            &format!("{API}/sandboxes?limit=10&continue={token}"),
        ))
        .await;
    assert_eq!(names(&rest), everything[2..].to_vec());

    // Bad values name the parameter.
    for query in [
        "limit=0",
        "limit=",
        "limit=x",
        "limit=10001",
        "limit=2&continue=nonsense",
    ] {
        let (status, _, body) = api
            .send(api.request(Method::GET, &format!("{API}/sandboxes?{query}")))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        let param = if query.contains("continue") {
            "continue"
        } else {
            "limit"
        };
        assert!(message.starts_with(param), "{query}: {message}");
    }
}
