//! The OpenAPI 3.1 document, generated from the Rust types: `paths` from a table of
//! [`Operation`]s (one per route, contributed by each part of the API) and `components.schemas`
//! from schemars (JSON Schema 2020-12, which OpenAPI 3.1 accepts as is).
//!
//! **Documenting a new route.** Next to its `.route(...)` line in the part's `routes()`, add one
//! [`Operation`] to the same part's `operations()` (`resources::docs`, `v1::operations`, or
//! `api::operations` for the top level): method and path exactly as routed, a unique
//! `operationId`, the body (`json_body::<T>()` for a strictly deserialized type,
//! `json_body_schema(name, value)` when the handler reads leniently or checks settings), every
//! success reply with its type (`ndjson::<Line>` for a stream), **every** error status the
//! handler can answer (`errors(&[...])`; 401 is implied), and `link(...)`s from a create to the
//! operations taking its id or name. Then regenerate `docs/openapi.json`
//! (`agent-sandbox openapi docs/openapi.json`) and run `bash tests/fuzz/run.sh`, which checks the
//! route against the document; `every_documented_operation_is_routed` checks it is routed.
//! docs/openapi.md says what the document promises and why the fuzz run has the exceptions it has.
//!
//! This module only describes routes; it never serves or routes anything itself. The committed copy
//! in `docs/openapi.json` is checked against the generated one by a test.

use std::path::Path;

use axum::http::Method;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{json, Map, Value};

use super::error::ErrorBody;

/// Produces the schema of one type, registering it (and what it refers to) in
/// `components.schemas` and returning a `$ref` to it.
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// The [`SchemaFn`] of `T`.
pub fn schema<T: JsonSchema>() -> SchemaFn {
    |generator| generator.subschema_for::<T>()
}

/// What travels in a request or response body.
#[derive(Clone, Debug)]
pub enum Body {
    /// `application/json` with a hand-written schema, registered under its name in
    /// `components.schemas` (for bodies read leniently, whose Rust type would say less or more
    /// than the server accepts, and for limits that come from the server's settings).
    Named(&'static str, Value),
    /// `application/json`.
    Json(SchemaFn),
    /// A resource document: `application/json` or YAML (`application/yaml`).
    Resource(SchemaFn),
    /// `application/x-ndjson`: one JSON value of this schema per line.
    Ndjson(SchemaFn),
    /// `application/octet-stream`: raw bytes.
    Binary,
    /// `application/json`: any JSON object (a document with no Rust type of its own).
    JsonObject,
    /// `application/merge-patch+json`: a JSON merge patch (RFC 7386) of this schema's document.
    MergePatch,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamIn {
    Path,
    Query,
}

/// A path or query parameter.
#[derive(Clone, Debug)]
pub struct Param {
    pub name: String,
    pub location: ParamIn,
    pub required: bool,
    pub description: String,
    /// JSON Schema of the value (a string unless said otherwise).
    pub schema: Value,
}

/// One documented response.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub description: String,
    pub body: Option<Body>,
}

/// One route of the API, as documented. Build with [`Operation::new`] and the builder methods.
///
/// ```
/// use agent_sandbox::api::openapi::Operation;
/// use axum::http::Method;
/// # #[derive(schemars::JsonSchema)] struct Sandbox;
/// # #[derive(schemars::JsonSchema)] struct SandboxCreate;
/// let op = Operation::new(Method::POST, "/v1/sandboxes", "createSandbox", "Create a sandbox")
///     .tag("sandboxes")
///     .json_body::<SandboxCreate>()
///     .json::<Sandbox>(201, "The new sandbox")
///     .errors(&[400, 403, 422, 429, 502]);
/// assert_eq!(op.path, "/v1/sandboxes");
/// ```
#[derive(Clone, Debug)]
pub struct Operation {
    pub method: Method,
    /// OpenAPI path template, e.g. `/v1/sandboxes/{id}`.
    pub path: String,
    pub operation_id: String,
    pub summary: String,
    pub description: String,
    pub tags: Vec<String>,
    /// Whether an API key is required (true unless [`Operation::public`] was called).
    pub authenticated: bool,
    pub params: Vec<Param>,
    pub request: Option<Body>,
    pub request_required: bool,
    /// Success responses.
    pub replies: Vec<Reply>,
    /// Error statuses, each answered with the common error shape. 401 is implied when
    /// authenticated.
    pub errors: Vec<u16>,
    /// OpenAPI links of success responses: (status, link name, target operation id, parameters
    /// as runtime expressions).
    pub links: Vec<Link>,
}

/// An OpenAPI link from a response to an operation that takes a value of it.
#[derive(Clone, Debug)]
pub struct Link {
    pub status: u16,
    pub name: String,
    pub operation_id: String,
    /// Target parameter name -> runtime expression (e.g. `$response.body#/id`).
    pub parameters: Vec<(String, String)>,
}

impl Operation {
    pub fn new(
        method: Method,
        path: impl Into<String>,
        operation_id: impl Into<String>,
        summary: impl Into<String>,
    ) -> Operation {
        Operation {
            method,
            path: path.into(),
            operation_id: operation_id.into(),
            summary: summary.into(),
            description: String::new(),
            tags: Vec::new(),
            authenticated: true,
            params: Vec::new(),
            request: None,
            request_required: false,
            replies: Vec::new(),
            errors: Vec::new(),
            links: Vec::new(),
        }
    }

    /// A link from the `status` response to `operation_id`, filling its `parameter` from
    /// `expression` (a runtime expression such as `$response.body#/metadata/name`).
    pub fn link(
        mut self,
        status: u16,
        operation_id: impl Into<String>,
        parameter: impl Into<String>,
        expression: impl Into<String>,
    ) -> Self {
        let operation_id = operation_id.into();
        self.links.push(Link {
            status,
            name: operation_id.clone(),
            operation_id,
            parameters: vec![(parameter.into(), expression.into())],
        });
        self
    }

    /// A required JSON request body with a hand-written schema named `name`.
    pub fn json_body_schema(mut self, name: &'static str, schema: Value) -> Self {
        self.request = Some(Body::Named(name, schema));
        self.request_required = true;
        self
    }

    /// A JSON request body with a hand-written schema named `name`, which may be left out.
    pub fn optional_json_body_schema(mut self, name: &'static str, schema: Value) -> Self {
        self.request = Some(Body::Named(name, schema));
        self.request_required = false;
        self
    }

    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = text.into();
        self
    }

    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.tags.push(tag.into());
        self
    }

    /// No API key needed.
    pub fn public(mut self) -> Self {
        self.authenticated = false;
        self
    }

    /// A `{name}` segment of the path (always a required string).
    pub fn path_param(mut self, name: impl Into<String>, description: impl Into<String>) -> Self {
        self.params.push(Param {
            name: name.into(),
            location: ParamIn::Path,
            required: true,
            description: description.into(),
            schema: json!({"type": "string"}),
        });
        self
    }

    /// A string query parameter.
    pub fn query(
        self,
        name: impl Into<String>,
        required: bool,
        description: impl Into<String>,
    ) -> Self {
        self.query_with_schema(name, required, description, json!({"type": "string"}))
    }

    /// A query parameter with its own JSON Schema (e.g. a pattern or a boolean).
    pub fn query_with_schema(
        mut self,
        name: impl Into<String>,
        required: bool,
        description: impl Into<String>,
        schema: Value,
    ) -> Self {
        self.params.push(Param {
            name: name.into(),
            location: ParamIn::Query,
            required,
            description: description.into(),
            schema,
        });
        self
    }

    /// A required JSON request body.
    pub fn json_body<T: JsonSchema>(mut self) -> Self {
        self.request = Some(Body::Json(schema::<T>()));
        self.request_required = true;
        self
    }

    /// A JSON request body that may be left out.
    pub fn optional_json_body<T: JsonSchema>(mut self) -> Self {
        self.request = Some(Body::Json(schema::<T>()));
        self.request_required = false;
        self
    }

    /// A required resource document (JSON or YAML).
    pub fn resource_body<T: JsonSchema>(mut self) -> Self {
        self.request = Some(Body::Resource(schema::<T>()));
        self.request_required = true;
        self
    }

    /// A required raw-bytes body.
    pub fn binary_body(mut self) -> Self {
        self.request = Some(Body::Binary);
        self.request_required = true;
        self
    }

    fn reply(mut self, status: u16, description: impl Into<String>, body: Option<Body>) -> Self {
        self.replies.push(Reply {
            status,
            description: description.into(),
            body,
        });
        self
    }

    /// A JSON success response.
    pub fn json<T: JsonSchema>(self, status: u16, description: impl Into<String>) -> Self {
        self.reply(status, description, Some(Body::Json(schema::<T>())))
    }

    /// A resource success response (JSON, or YAML when asked for with `Accept`).
    pub fn resource<T: JsonSchema>(self, status: u16, description: impl Into<String>) -> Self {
        self.reply(status, description, Some(Body::Resource(schema::<T>())))
    }

    /// An NDJSON streaming response of `T` lines.
    pub fn ndjson<T: JsonSchema>(self, status: u16, description: impl Into<String>) -> Self {
        self.reply(status, description, Some(Body::Ndjson(schema::<T>())))
    }

    /// A JSON success response that is any object.
    pub fn json_object(self, status: u16, description: impl Into<String>) -> Self {
        self.reply(status, description, Some(Body::JsonObject))
    }

    /// A raw-bytes success response.
    pub fn binary(self, status: u16, description: impl Into<String>) -> Self {
        self.reply(status, description, Some(Body::Binary))
    }

    /// A success response without a body (e.g. 204).
    pub fn empty(self, status: u16, description: impl Into<String>) -> Self {
        self.reply(status, description, None)
    }

    /// Error statuses this route may answer (in the common error shape).
    pub fn errors(mut self, statuses: &[u16]) -> Self {
        for status in statuses {
            if !self.errors.contains(status) {
                self.errors.push(*status);
            }
        }
        self
    }
}

fn content(body: Body, generator: &mut SchemaGenerator, named: &mut Map<String, Value>) -> Value {
    match body {
        Body::Named(name, schema) => {
            named.insert(name.to_string(), schema);
            json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{name}")}}})
        }
        Body::Json(f) => json!({"application/json": {"schema": f(generator)}}),
        Body::Resource(f) => {
            let schema = f(generator);
            json!({
                "application/json": {"schema": schema.clone()},
                "application/yaml": {"schema": schema},
            })
        }
        // OpenAPI 3.1 has no item schema for sequential media types (3.2's `itemSchema`): the
        // schema is of the whole stream read as an array, one element per line.
        Body::Ndjson(f) => json!({"application/x-ndjson": {"schema": {
            "type": "array",
            "description": "Newline-delimited JSON: one element per line, as it happens.",
            "items": f(generator),
        }}}),
        Body::JsonObject => json!({"application/json": {"schema": {"type": "object"}}}),
        // The fields a patch may name are the document's own; what a named field may hold is
        // judged on the merged document (RFC 7386: `null` removes), which no schema of the
        // patch alone can say, so the fields' values are left open.
        Body::MergePatch => json!({"application/merge-patch+json": {"schema": {
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
                "spec": {"type": "object"},
            },
        }}}),
        Body::Binary => {
            json!({"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}})
        }
    }
}

fn error_description(status: u16) -> &'static str {
    match status {
        400 => "Invalid request",
        401 => "Missing or invalid API key",
        403 => "Forbidden",
        404 => "Not found",
        405 => "Method not allowed",
        409 => "Conflict",
        413 => "Payload too large",
        415 => "Unsupported Content-Type",
        422 => "The body does not match the schema",
        429 => "Sandbox limit reached",
        502 => "Docker failed or is unreachable",
        503 => "Unavailable",
        _ => "Error",
    }
}

fn operation_value(
    op: &Operation,
    generator: &mut SchemaGenerator,
    named: &mut Map<String, Value>,
) -> Value {
    let mut out = Map::new();
    if !op.tags.is_empty() {
        out.insert("tags".into(), json!(op.tags));
    }
    out.insert("summary".into(), json!(op.summary));
    if !op.description.is_empty() {
        out.insert("description".into(), json!(op.description));
    }
    out.insert("operationId".into(), json!(op.operation_id));
    out.insert(
        "security".into(),
        if op.authenticated {
            json!([{"bearerAuth": []}, {"apiKeyHeader": []}])
        } else {
            json!([])
        },
    );
    if !op.params.is_empty() {
        let params: Vec<Value> = op
            .params
            .iter()
            .map(|p| {
                let mut param = json!({
                    "name": p.name,
                    "in": match p.location { ParamIn::Path => "path", ParamIn::Query => "query" },
                    "required": p.required,
                    "schema": p.schema,
                });
                if !p.description.is_empty() {
                    param["description"] = json!(p.description);
                }
                param
            })
            .collect();
        out.insert("parameters".into(), Value::Array(params));
    }
    if let Some(body) = op.request.clone() {
        out.insert(
            "requestBody".into(),
            json!({"required": op.request_required, "content": content(body, generator, named)}),
        );
    }
    let mut responses = Map::new();
    for reply in &op.replies {
        // Several replies with one status are one response with several content types.
        let value = responses
            .entry(reply.status.to_string())
            .or_insert_with(|| json!({"description": reply.description}));
        if let Some(body) = reply.body.clone() {
            if let (Some(value), Value::Object(more)) =
                (value.as_object_mut(), content(body, generator, named))
            {
                let all = value
                    .entry("content")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Some(all) = all.as_object_mut() {
                    all.extend(more);
                }
            }
        }
    }
    for link in &op.links {
        if let Some(response) = responses
            .get_mut(&link.status.to_string())
            .and_then(Value::as_object_mut)
        {
            let parameters: Map<String, Value> = link
                .parameters
                .iter()
                .map(|(name, expression)| (name.clone(), json!(expression)))
                .collect();
            let links = response
                .entry("links")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(links) = links.as_object_mut() {
                links.insert(
                    link.name.clone(),
                    json!({"operationId": link.operation_id, "parameters": parameters}),
                );
            }
        }
    }
    let error_ref = schema::<ErrorBody>()(generator);
    let mut errors = op.errors.clone();
    if op.authenticated && !errors.contains(&401) {
        errors.push(401);
    }
    for status in errors {
        responses.insert(
            status.to_string(),
            json!({
                "description": error_description(status),
                "content": {"application/json": {"schema": error_ref.clone()}},
            }),
        );
    }
    out.insert("responses".into(), Value::Object(responses));
    Value::Object(out)
}

/// Builds the OpenAPI 3.1 document of `operations`.
pub fn document(operations: &[Operation]) -> Value {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .with_transform(crate::resource::schema::integer_bounds)
        .into_generator();
    let mut paths = Map::new();
    let mut named = Map::new();
    for op in operations {
        let value = operation_value(op, &mut generator, &mut named);
        let item = paths
            .entry(op.path.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(item) = item.as_object_mut() {
            item.insert(op.method.as_str().to_ascii_lowercase(), value);
        }
    }
    schema::<ErrorBody>()(&mut generator);
    let mut schemas = generator.take_definitions(true);
    for (name, schema) in named {
        // A hand-written schema under the name of a derived one would silently replace it
        // everywhere it is referenced (it once did: /v1's rollback body over a sandbox's
        // `spec.rollback`). Every test that builds the document trips on this.
        assert!(
            !schemas.contains_key(&name),
            "the hand-written schema {name:?} has the name of a type's schema"
        );
        schemas.insert(name, schema);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "agent-sandbox",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Disposable, hardened Docker sandboxes for AI agents. The resource API \
                (/apis/agent-sandbox.io/v1) declares desired state; /v1 is the agent-sandbox wire \
                contract.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer"},
                "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
    })
}

/// The document as committed and served: pretty JSON with a trailing newline.
pub fn to_text(document: &Value) -> String {
    serde_json::to_string_pretty(document).unwrap_or_default() + "\n"
}

/// Writes `document` to `path` (used by `agent-sandbox openapi`).
pub fn write(document: &Value, path: &Path) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, to_text(document))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Thing {
        name: String,
    }

    #[test]
    fn builds_paths_and_shared_schemas() {
        let ops = vec![
            Operation::new(Method::GET, "/things/{id}", "getThing", "Get a thing")
                .path_param("id", "Thing")
                .json::<Thing>(200, "The thing")
                .errors(&[404]),
            Operation::new(Method::POST, "/things", "makeThing", "Make a thing")
                .json_body::<Thing>()
                .json::<Thing>(201, "Made"),
            Operation::new(Method::GET, "/ping", "ping", "Ping")
                .public()
                .empty(204, "Up"),
        ];
        let doc = document(&ops);
        assert_eq!(doc["openapi"], "3.1.0");
        let get = &doc["paths"]["/things/{id}"]["get"];
        assert_eq!(
            get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/Thing"
        );
        assert_eq!(
            get["responses"]["404"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/Error"
        );
        assert!(get["responses"]["401"].is_object());
        assert!(doc["paths"]["/ping"]["get"]["responses"]["401"].is_null());
        assert!(doc["components"]["schemas"]["Thing"].is_object());
        assert!(doc["components"]["schemas"]["ErrorDetail"].is_object());
    }
}
