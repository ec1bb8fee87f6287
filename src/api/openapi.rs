//! The OpenAPI 3.1 document is the router's own description: every route is registered with
//! [aide](https://docs.rs/aide)'s `api_route`, and the operation it documents is written in the
//! same call, so a route cannot be documented without being routed nor routed (by `api_route`)
//! without being documented; its method and path are the router's. `components.schemas` comes
//! from schemars (JSON Schema 2020-12, which OpenAPI 3.1 accepts as is), through the generator
//! installed by [`begin`].
//!
//! **Documenting a new route.** Register it in its part's `routes()` with
//! `.api_route(path, get_with(handler, |op| ...))` (`post_with`, `put_with`, ... from
//! `aide::axum::routing`), never with `.route(...)`. In the closure: `id` (a unique
//! `operationId`), `summary`, `tag`, optionally `description`, then this module's [`Describe`]
//! vocabulary: every `{name}` of the path as a `path_param`, every query parameter, the body
//! (`json_body::<T>()` for a strictly deserialized type, `json_body_schema(name, value)` when the
//! handler reads leniently or checks settings), every success reply with its type
//! (`ndjson::<Line>` for a stream, `websocket` for an upgrade), **every** error status the handler
//! can answer (`errors(&[...])`; 401 is added to every route behind the API key by the router),
//! and `link(...)`s from a create to the operations taking its id or name. Then regenerate
//! `docs/openapi.json` (`agent-sandbox openapi docs/openapi.json`) and run
//! `bash tests/fuzz/run.sh`, which checks the handler against the document. [`finish`] refuses a
//! document whose operations lack an id, a summary, a success reply or a path parameter, or
//! link to an operation that does not exist. docs/openapi.md says what the document promises.
//!
//! Handlers read their inputs themselves (leniently, naming the field at fault, with limits from
//! the settings), so aide's inference from extractor and return types is off: what a route
//! accepts and answers is what its closure says. This module only describes routes; it never
//! serves anything. The committed copy in `docs/openapi.json` is checked against the generated
//! one by a test.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use aide::axum::ApiRouter;
use aide::generate::in_context;
use aide::openapi::{
    self, Info, Link, LinkOperation, MediaType, OpenApi, Parameter, ParameterData,
    ParameterSchemaOrContent, PathItem, ReferenceOr, RequestBody, Response, SchemaObject,
    SecurityScheme, StatusCode,
};
use aide::transform::TransformOperation;
use axum::Router;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{json, Value};

use super::error::ErrorBody;

thread_local! {
    /// Hand-written schemas registered by name while routes are described on this thread.
    static NAMED: RefCell<BTreeMap<String, Value>> = const { RefCell::new(BTreeMap::new()) };
    /// What aide found wrong while routes were described (e.g. one operation documented twice).
    static ERRORS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// The schema generator of the document: JSON Schema 2020-12 with definitions under
/// `#/components/schemas`, and fixed-size integers bounded as the resource schemas are.
fn generator() -> SchemaGenerator {
    SchemaSettings::draft2020_12()
        .with(|s| {
            s.definitions_path = "/components/schemas".into();
            s.meta_schema = None;
        })
        .with_transform(crate::resource::schema::integer_bounds)
        .into_generator()
}

/// Starts describing routes on this thread: aide's context gets this document's generator, and
/// its inference from handler types is turned off (see the module documentation). Call before
/// building the routes that [`finish`] turns into a document.
pub fn begin() {
    aide::generate::reset_context();
    aide::generate::infer_responses(false);
    aide::generate::on_error(|error| {
        ERRORS.with(|errors| errors.borrow_mut().push(error.to_string()))
    });
    in_context(|ctx| {
        ctx.schema = generator();
        // Every error answer refers to it, and it is there even for a document without one.
        ctx.schema.subschema_for::<ErrorBody>();
    });
    NAMED.with(|named| named.borrow_mut().clear());
    ERRORS.with(|errors| errors.borrow_mut().clear());
}

/// The schema of `T` in the document (a `$ref` for named types).
fn schema_of<T: JsonSchema>() -> Schema {
    in_context(|ctx| ctx.schema.subschema_for::<T>())
}

fn schema_value(value: Value) -> Schema {
    Schema::try_from(value).expect("a schema is a JSON object or boolean")
}

fn media(schema: Schema) -> MediaType {
    MediaType {
        schema: Some(SchemaObject {
            json_schema: schema,
            example: None,
            external_docs: None,
        }),
        ..MediaType::default()
    }
}

/// A hand-written schema under `name` in `components.schemas`, and a `$ref` to it.
fn named(name: &str, schema: Value) -> Schema {
    NAMED.with(|named| {
        let mut named = named.borrow_mut();
        if let Some(earlier) = named.get(name) {
            assert!(
                earlier == &schema,
                "two different hand-written schemas are named {name:?}"
            );
        }
        named.insert(name.to_string(), schema);
    });
    schema_value(json!({"$ref": format!("#/components/schemas/{name}")}))
}

/// What travels in a request or response body.
enum Body {
    /// `application/json`.
    Json(Schema),
    /// A resource document: `application/json` or YAML (`application/yaml`).
    Resource(Schema),
    /// `application/x-ndjson`: one JSON value of this schema per line.
    Ndjson(Schema),
    /// `application/octet-stream`: raw bytes.
    Binary,
    /// `application/merge-patch+json`: a JSON merge patch (RFC 7386) of a document of this
    /// kind.
    MergePatch(&'static str),
    /// Text of this media type.
    Text(&'static str),
    /// `application/x-www-form-urlencoded`: an HTML form's fields.
    Form(Schema),
}

fn content(body: Body) -> Vec<(String, MediaType)> {
    let one = |media_type: &str, schema: Schema| vec![(media_type.to_string(), media(schema))];
    match body {
        Body::Json(schema) => one("application/json", schema),
        Body::Resource(schema) => vec![
            ("application/json".into(), media(schema.clone())),
            ("application/yaml".into(), media(schema)),
        ],
        // OpenAPI 3.1 has no item schema for sequential media types (3.2's `itemSchema`): the
        // schema is of the whole stream read as an array, one element per line.
        Body::Ndjson(schema) => one(
            "application/x-ndjson",
            schema_value(json!({
                "type": "array",
                "description": "Newline-delimited JSON: one element per line, as it happens.",
                "items": schema,
            })),
        ),
        Body::Text(media_type) => one(media_type, schema_value(json!({"type": "string"}))),
        Body::Form(schema) => one("application/x-www-form-urlencoded", schema),
        Body::Binary => one(
            "application/octet-stream",
            schema_value(json!({"type": "string", "format": "binary"})),
        ),
        // The fields a patch may name are the document's own; what a named field may hold is
        // judged on the merged document (RFC 7386: `null` removes), which no schema of the
        // patch alone can say, so the fields' values are left open; `apiVersion` and `kind`
        // cannot change, so a patch may only repeat them.
        Body::MergePatch(kind) => one(
            "application/merge-patch+json",
            schema_value(json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "apiVersion": {"type": "string", "enum": [crate::resource::API_VERSION]},
                    "kind": {"type": "string", "enum": [kind]},
                    "metadata": {"type": "object"},
                    "spec": {"type": "object"},
                },
            })),
        ),
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

fn responses(op: &mut openapi::Operation) -> &mut openapi::Responses {
    op.responses.get_or_insert_with(Default::default)
}

/// The response of `op` for `status`, if it has one.
fn response_mut(op: &mut openapi::Operation, status: u16) -> Option<&mut Response> {
    match responses(op).responses.get_mut(&StatusCode::Code(status)) {
        Some(ReferenceOr::Item(response)) => Some(response),
        _ => None,
    }
}

/// Adds an error answer in the common error shape.
fn error_response(op: &mut openapi::Operation, status: u16) {
    let error = schema_of::<ErrorBody>();
    responses(op).responses.insert(
        StatusCode::Code(status),
        ReferenceOr::Item(Response {
            description: error_description(status).into(),
            content: [("application/json".to_string(), media(error))]
                .into_iter()
                .collect(),
            ..Response::default()
        }),
    );
}

/// This module's vocabulary for describing an operation, next to aide's own `id`, `summary`,
/// `description` and `tag`.
pub trait Describe: Sized {
    /// A `{name}` segment of the path (always a required string).
    fn path_param(self, name: &str, description: &str) -> Self;
    /// A path parameter with its own schema (a port, say).
    fn path_param_with_schema(self, name: &str, description: &str, schema: Value) -> Self;
    /// A string query parameter.
    fn query(self, name: &str, required: bool, description: &str) -> Self {
        self.query_with_schema(name, required, description, json!({"type": "string"}))
    }
    /// A query parameter with its own JSON Schema (e.g. a pattern or a boolean).
    fn query_with_schema(
        self,
        name: &str,
        required: bool,
        description: &str,
        schema: Value,
    ) -> Self;
    /// A required JSON request body.
    fn json_body<T: JsonSchema>(self) -> Self;
    /// A JSON request body that may be left out.
    fn optional_json_body<T: JsonSchema>(self) -> Self;
    /// A required JSON request body with a hand-written schema named `name`.
    fn json_body_schema(self, name: &str, schema: Value) -> Self;
    /// An HTML form's fields (`application/x-www-form-urlencoded`), described by `schema`.
    fn form_body_schema(self, name: &str, schema: Value) -> Self;
    /// A JSON request body with a hand-written schema named `name`, which may be left out.
    fn optional_json_body_schema(self, name: &str, schema: Value) -> Self;
    /// A required resource document (JSON or YAML).
    fn resource_body<T: JsonSchema>(self) -> Self;
    /// A required JSON merge patch of a resource document.
    fn merge_patch_body(self, kind: &'static str) -> Self;
    /// A required raw-bytes body.
    fn binary_body(self) -> Self;
    /// An optional body of any bytes.
    fn optional_binary_body(self) -> Self;
    /// A JSON success response.
    fn json<T: JsonSchema>(self, status: u16, description: &str) -> Self;
    /// A resource success response (JSON, or YAML when asked for with `Accept`).
    fn resource<T: JsonSchema>(self, status: u16, description: &str) -> Self;
    /// An NDJSON streaming response of `T` lines (with another reply of the same status, one
    /// response with both media types).
    fn ndjson<T: JsonSchema>(self, status: u16, description: &str) -> Self;
    /// A JSON success response that is any object.
    fn json_object(self, status: u16, description: &str) -> Self;
    /// A raw-bytes success response.
    fn binary(self, status: u16, description: &str) -> Self;
    /// A text reply of `media_type`.
    fn text(self, status: u16, media_type: &'static str, description: &str) -> Self;
    /// A success response without a body (e.g. 204).
    fn empty(self, status: u16, description: &str) -> Self;
    /// The upgrade to a WebSocket (101), replacing what aide infers from `WebSocketUpgrade`.
    fn websocket(self, description: &str) -> Self;
    /// Error statuses this route may answer (in the common error shape).
    fn errors(self, statuses: &[u16]) -> Self;
    /// A link from the `status` response to `operation_id`, filling its `parameter` from
    /// `expression` (a runtime expression such as `$response.body#/metadata/name`).
    fn link(self, status: u16, operation_id: &str, parameter: &str, expression: &str) -> Self;
}

fn parameter_data(name: &str, required: bool, description: &str, schema: Value) -> ParameterData {
    ParameterData {
        name: name.into(),
        description: (!description.is_empty()).then(|| description.to_string()),
        required,
        deprecated: None,
        format: ParameterSchemaOrContent::Schema(SchemaObject {
            json_schema: schema_value(schema),
            example: None,
            external_docs: None,
        }),
        example: None,
        examples: Default::default(),
        explode: None,
        extensions: Default::default(),
    }
}

fn set_body(op: &mut TransformOperation<'_>, body: Body, required: bool) {
    op.inner_mut().request_body = Some(ReferenceOr::Item(RequestBody {
        content: content(body).into_iter().collect(),
        required,
        ..RequestBody::default()
    }));
}

fn reply(op: &mut TransformOperation<'_>, status: u16, description: &str, body: Option<Body>) {
    let op = op.inner_mut();
    let more = body.map(content).unwrap_or_default();
    // Several replies with one status are one response with several media types.
    if let Some(response) = response_mut(op, status) {
        response.content.extend(more);
        return;
    }
    responses(op).responses.insert(
        StatusCode::Code(status),
        ReferenceOr::Item(Response {
            description: description.into(),
            content: more.into_iter().collect(),
            ..Response::default()
        }),
    );
}

impl Describe for TransformOperation<'_> {
    fn path_param(self, name: &str, description: &str) -> Self {
        self.path_param_with_schema(name, description, json!({"type": "string"}))
    }

    fn path_param_with_schema(mut self, name: &str, description: &str, schema: Value) -> Self {
        self.inner_mut()
            .parameters
            .push(ReferenceOr::Item(Parameter::Path {
                parameter_data: parameter_data(name, true, description, schema),
                style: Default::default(),
            }));
        self
    }

    fn query_with_schema(
        mut self,
        name: &str,
        required: bool,
        description: &str,
        schema: Value,
    ) -> Self {
        self.inner_mut()
            .parameters
            .push(ReferenceOr::Item(Parameter::Query {
                parameter_data: parameter_data(name, required, description, schema),
                allow_reserved: false,
                style: Default::default(),
                allow_empty_value: None,
            }));
        self
    }

    fn json_body<T: JsonSchema>(mut self) -> Self {
        set_body(&mut self, Body::Json(schema_of::<T>()), true);
        self
    }

    fn optional_json_body<T: JsonSchema>(mut self) -> Self {
        set_body(&mut self, Body::Json(schema_of::<T>()), false);
        self
    }

    fn json_body_schema(mut self, name: &str, schema: Value) -> Self {
        set_body(&mut self, Body::Json(named(name, schema)), true);
        self
    }

    fn form_body_schema(mut self, name: &str, schema: Value) -> Self {
        set_body(&mut self, Body::Form(named(name, schema)), true);
        self
    }

    fn optional_json_body_schema(mut self, name: &str, schema: Value) -> Self {
        set_body(&mut self, Body::Json(named(name, schema)), false);
        self
    }

    fn resource_body<T: JsonSchema>(mut self) -> Self {
        set_body(&mut self, Body::Resource(schema_of::<T>()), true);
        self
    }

    fn merge_patch_body(mut self, kind: &'static str) -> Self {
        set_body(&mut self, Body::MergePatch(kind), true);
        self
    }

    fn binary_body(mut self) -> Self {
        set_body(&mut self, Body::Binary, true);
        self
    }

    fn optional_binary_body(mut self) -> Self {
        set_body(&mut self, Body::Binary, false);
        self
    }

    fn json<T: JsonSchema>(mut self, status: u16, description: &str) -> Self {
        reply(
            &mut self,
            status,
            description,
            Some(Body::Json(schema_of::<T>())),
        );
        self
    }

    fn resource<T: JsonSchema>(mut self, status: u16, description: &str) -> Self {
        reply(
            &mut self,
            status,
            description,
            Some(Body::Resource(schema_of::<T>())),
        );
        self
    }

    fn ndjson<T: JsonSchema>(mut self, status: u16, description: &str) -> Self {
        reply(
            &mut self,
            status,
            description,
            Some(Body::Ndjson(schema_of::<T>())),
        );
        self
    }

    fn json_object(mut self, status: u16, description: &str) -> Self {
        let object = schema_value(json!({"type": "object"}));
        reply(&mut self, status, description, Some(Body::Json(object)));
        self
    }

    fn binary(mut self, status: u16, description: &str) -> Self {
        reply(&mut self, status, description, Some(Body::Binary));
        self
    }

    fn text(mut self, status: u16, media_type: &'static str, description: &str) -> Self {
        reply(&mut self, status, description, Some(Body::Text(media_type)));
        self
    }

    fn empty(mut self, status: u16, description: &str) -> Self {
        reply(&mut self, status, description, None);
        self
    }

    fn websocket(mut self, description: &str) -> Self {
        // aide's inferred 101 lists request headers as response headers; the upgrade is said
        // in the operation's description instead.
        responses(self.inner_mut())
            .responses
            .shift_remove(&StatusCode::Code(101));
        self.empty(101, description)
    }

    fn errors(mut self, statuses: &[u16]) -> Self {
        for status in statuses {
            error_response(self.inner_mut(), *status);
        }
        self
    }

    fn link(mut self, status: u16, operation_id: &str, parameter: &str, expression: &str) -> Self {
        let op = self.inner_mut();
        let response = response_mut(op, status).unwrap_or_else(|| {
            panic!("a link from the {status} response of an operation that has none")
        });
        response.links.insert(
            operation_id.to_string(),
            ReferenceOr::Item(Link {
                description: None,
                operation: LinkOperation::OperationId(operation_id.to_string()),
                request_body: None,
                parameters: [(parameter.to_string(), json!(expression))]
                    .into_iter()
                    .collect(),
                server: None,
                extensions: Default::default(),
            }),
        );
        self
    }
}

/// The operations of a path item, each with its method.
fn operations_mut(
    item: &mut PathItem,
) -> impl Iterator<Item = (&'static str, &mut openapi::Operation)> {
    [
        ("get", &mut item.get),
        ("put", &mut item.put),
        ("post", &mut item.post),
        ("delete", &mut item.delete),
        ("options", &mut item.options),
        ("head", &mut item.head),
        ("patch", &mut item.patch),
        ("trace", &mut item.trace),
    ]
    .into_iter()
    .filter_map(|(method, op)| op.as_mut().map(|op| (method, op)))
}

/// Marks every operation of `router` as needing the API key (the router puts them behind
/// it): both security schemes, and the 401 answer.
pub fn behind_api_key<S: Clone + Send + Sync + 'static>(router: ApiRouter<S>) -> ApiRouter<S> {
    router.with_path_items(|mut item| {
        for (_, op) in operations_mut(item.inner_mut()) {
            op.security = ["bearerAuth", "apiKeyHeader"]
                .into_iter()
                .map(|scheme| [(scheme.to_string(), Vec::new())].into_iter().collect())
                .collect();
            error_response(op, 401);
        }
        item
    })
}

/// Turns the described routes into the router and its OpenAPI document. Panics on a document
/// that cannot be right (see the module documentation): every test that builds the router or
/// the document trips on it.
pub fn finish<S: Clone + Send + Sync + 'static>(router: ApiRouter<S>) -> (Router<S>, Value) {
    let mut api = OpenApi {
        info: Info {
            title: "agent-sandbox".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: Some(
                "Disposable, hardened Docker sandboxes for AI agents. The resource API \
                 (/apis/agent-sandbox.io/v1) declares desired state; /v1 is the agent-sandbox \
                 wire contract."
                    .into(),
            ),
            ..Info::default()
        },
        ..OpenApi::default()
    };
    let errors = ERRORS.with(|errors| std::mem::take(&mut *errors.borrow_mut()));
    assert!(errors.is_empty(), "the routes' descriptions: {errors:?}");
    let router = router.finish_api(&mut api);
    wildcards_as_parameters(&mut api);
    let components = api.components.get_or_insert_with(Default::default);
    for (name, schema) in NAMED.with(|named| std::mem::take(&mut *named.borrow_mut())) {
        // A hand-written schema under the name of a derived one would silently replace it
        // everywhere it is referenced (it once did: /v1's rollback body over a sandbox's
        // `spec.rollback`).
        assert!(
            !components.schemas.contains_key(&name),
            "the hand-written schema {name:?} has the name of a type's schema"
        );
        components.schemas.insert(
            name,
            SchemaObject {
                json_schema: schema_value(schema),
                example: None,
                external_docs: None,
            },
        );
    }
    components.security_schemes.insert(
        "bearerAuth".into(),
        ReferenceOr::Item(SecurityScheme::Http {
            scheme: "bearer".into(),
            bearer_format: None,
            description: None,
            extensions: Default::default(),
        }),
    );
    components.security_schemes.insert(
        "apiKeyHeader".into(),
        ReferenceOr::Item(SecurityScheme::ApiKey {
            location: openapi::ApiKeyLocation::Header,
            name: "X-API-Key".into(),
            description: None,
            extensions: Default::default(),
        }),
    );
    check(&api);
    let mut document = serde_json::to_value(&api).expect("the OpenAPI document serializes");
    state_defaults(&mut document);
    namespaced_twins(&mut document);
    (router, document)
}

/// Documents `/apis/agent-sandbox.io/v1/namespaces/{namespace}/…`, the namespaced twin of every
/// path of a namespaced kind (served by the same handlers, see `super::namespace`): the same
/// operations with a `namespace` parameter, ids ending in `Namespaced`, and a 404 for a
/// namespace name that is not one.
fn namespaced_twins(document: &mut Value) {
    const APIS: &str = "/apis/agent-sandbox.io/v1/";
    let Some(paths) = document.get("paths").and_then(Value::as_object) else {
        return;
    };
    let namespaced = |rest: &str| {
        let plural = rest.split('/').next().unwrap_or_default();
        plural == "events"
            || crate::resource::Kind::from_plural(plural)
                .is_some_and(|k| k != crate::resource::Kind::Webhook)
    };
    let parameter = serde_json::json!({
        "in": "path",
        "name": "namespace",
        "required": true,
        "description": "The namespace of the objects (names are unique per namespace).",
        "schema": {"type": "string", "pattern": crate::resource::NAMESPACE_PATTERN},
    });
    let not_found = serde_json::json!({
        "description": "No such namespace name, or no such object in it",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    });
    let mut twins = serde_json::Map::new();
    for (path, item) in paths {
        let Some(rest) = path.strip_prefix(APIS).filter(|rest| namespaced(rest)) else {
            continue;
        };
        let mut twin = item.clone();
        if let Some(operations) = twin.as_object_mut() {
            for (method, operation) in operations.iter_mut() {
                if method == "parameters" {
                    continue;
                }
                if let Some(id) = operation.get("operationId").and_then(Value::as_str) {
                    operation["operationId"] = Value::String(format!("{id}Namespaced"));
                }
                match operation
                    .get_mut("parameters")
                    .and_then(Value::as_array_mut)
                {
                    Some(list) => list.insert(0, parameter.clone()),
                    None => operation["parameters"] = Value::Array(vec![parameter.clone()]),
                }
                if let Some(responses) = operation
                    .get_mut("responses")
                    .and_then(Value::as_object_mut)
                {
                    responses.entry("404").or_insert_with(|| not_found.clone());
                }
            }
        }
        twins.insert(format!("{APIS}namespaces/{{namespace}}/{rest}"), twin);
    }
    if let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) {
        paths.extend(twins);
    }
}

/// A route's wildcard (`{*path}`, axum's syntax) is a plain path parameter in the document.
fn wildcards_as_parameters(api: &mut OpenApi) {
    let Some(paths) = api.paths.as_mut() else {
        return;
    };
    let items = std::mem::take(&mut paths.paths);
    paths.paths = items
        .into_iter()
        .map(|(path, item)| (path.replace("{*", "{"), item))
        .collect();
}

/// aide leaves out what equals its default; the document says it: `security: []` marks a public
/// operation, `required: false` an optional parameter or body.
fn state_defaults(document: &mut Value) {
    let Some(paths) = document["paths"].as_object_mut() else {
        return;
    };
    for op in paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(Value::as_object_mut)
    {
        op.entry("security").or_insert_with(|| json!([]));
        if let Some(body) = op.get_mut("requestBody").and_then(Value::as_object_mut) {
            body.entry("required").or_insert(Value::Bool(false));
        }
        if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
            for param in params.iter_mut().filter_map(Value::as_object_mut) {
                param.entry("required").or_insert(Value::Bool(false));
            }
        }
    }
}

/// What no document of this server may lack.
fn check(api: &OpenApi) {
    let mut ids = BTreeSet::new();
    let mut links = Vec::new();
    for (path, method, op) in api.operations() {
        let at = format!("{} {path}", method.to_uppercase());
        let id = op.operation_id.as_deref().unwrap_or_default();
        assert!(!id.is_empty(), "{at} has no operationId");
        assert!(ids.insert(id.to_string()), "operationId {id} is used twice");
        assert!(op.summary.is_some(), "{at} has no summary");
        let replies = op.responses.as_ref().map(|r| &r.responses);
        assert!(
            replies.is_some_and(|r| r.keys().any(|status| matches!(
                status,
                // A form's success is a redirect (303 See Other).
                StatusCode::Code(code) if (100..300).contains(code) || *code == 303
            ))),
            "{at} documents no success reply"
        );
        let in_path: BTreeSet<&str> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .collect();
        let documented: BTreeSet<&str> = op
            .parameters
            .iter()
            .filter_map(|p| match p {
                ReferenceOr::Item(Parameter::Path { parameter_data, .. }) => {
                    Some(parameter_data.name.as_str())
                }
                _ => None,
            })
            .collect();
        assert_eq!(in_path, documented, "{at}: path parameters");
        for response in replies.into_iter().flat_map(|r| r.values()) {
            if let ReferenceOr::Item(response) = response {
                for link in response.links.values() {
                    if let ReferenceOr::Item(Link {
                        operation: LinkOperation::OperationId(target),
                        ..
                    }) = link
                    {
                        links.push((at.clone(), target.clone()));
                    }
                }
            }
        }
    }
    for (from, target) in links {
        assert!(ids.contains(&target), "{from} links to unknown {target}");
    }
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
    use aide::axum::routing::{get_with, post_with};

    use super::*;

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Thing {
        name: String,
    }

    async fn handler() -> &'static str {
        "ok"
    }

    fn document(protected: ApiRouter, public: ApiRouter) -> Value {
        finish(public.merge(behind_api_key(protected))).1
    }

    #[test]
    fn builds_paths_and_shared_schemas() {
        begin();
        let protected = ApiRouter::new()
            .api_route(
                "/things/{id}",
                get_with(handler, |op| {
                    op.id("getThing")
                        .summary("Get a thing")
                        .path_param("id", "Thing")
                        .json::<Thing>(200, "The thing")
                        .errors(&[404])
                }),
            )
            .api_route(
                "/things",
                post_with(handler, |op| {
                    op.id("makeThing")
                        .summary("Make a thing")
                        .json_body::<Thing>()
                        .json::<Thing>(201, "Made")
                        .link(201, "getThing", "id", "$response.body#/name")
                }),
            );
        let public = ApiRouter::new().api_route(
            "/ping",
            get_with(handler, |op| op.id("ping").summary("Ping").empty(204, "Up")),
        );
        let doc = document(protected, public);
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
        assert_eq!(get["security"][0], json!({"bearerAuth": []}));
        assert!(doc["paths"]["/ping"]["get"]["responses"]["401"].is_null());
        assert_eq!(doc["paths"]["/ping"]["get"]["security"], json!([]));
        assert_eq!(
            doc["paths"]["/things"]["post"]["responses"]["201"]["links"]["getThing"],
            json!({"operationId": "getThing", "parameters": {"id": "$response.body#/name"}})
        );
        assert!(doc["components"]["schemas"]["Thing"].is_object());
        assert!(doc["components"]["schemas"]["ErrorDetail"].is_object());
    }

    #[test]
    #[should_panic(expected = "path parameters")]
    fn an_undocumented_path_parameter_is_refused() {
        begin();
        let router = ApiRouter::<()>::new().api_route(
            "/things/{id}",
            get_with(handler, |op| {
                op.id("getThing").summary("Get").empty(200, "ok")
            }),
        );
        let _ = finish(router);
    }

    #[test]
    #[should_panic(expected = "links to unknown")]
    fn a_link_to_an_unknown_operation_is_refused() {
        begin();
        let router = ApiRouter::<()>::new().api_route(
            "/things",
            post_with(handler, |op| {
                op.id("makeThing").summary("Make").empty(201, "Made").link(
                    201,
                    "getThing",
                    "id",
                    "$response.body#/id",
                )
            }),
        );
        let _ = finish(router);
    }

    #[test]
    #[should_panic(expected = "no operationId")]
    fn a_route_without_an_id_is_refused() {
        begin();
        let router = ApiRouter::<()>::new()
            .api_route("/things", get_with(handler, |op| op.summary("Things")));
        let _ = finish(router);
    }
}
