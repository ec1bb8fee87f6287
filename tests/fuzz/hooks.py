"""Schemathesis hooks for the fuzz run (loaded through tests/fuzz/schemathesis.toml).

Only what the document cannot say and a client would do anyway lives here; nothing may relax a
check or hide a mismatch between the document and the server.
"""

import json

import schemathesis

# A watch is an open-ended stream by design; the run needs every response to end. Clients bound a
# watch with the documented `timeoutSeconds` parameter, and so does the fuzzer.
WATCH_SECONDS = 1


def _truthy(value):
    return str(value).lower() in ("true", "1")


@schemathesis.hook
def map_query(context, query):
    if query and _truthy(query.get("watch", "")):
        try:
            seconds = int(query.get("timeoutSeconds"))
        except (TypeError, ValueError):
            seconds = None
        if seconds is None or not 1 <= seconds <= WATCH_SECONDS:
            query["timeoutSeconds"] = WATCH_SECONDS
    return query


@schemathesis.deserializer("application/x-ndjson")
def ndjson(ctx, response):
    """The document gives an NDJSON stream the schema of its lines read as an array."""
    # Only "\n" ends a line (str.splitlines would also split inside strings, at U+0085 or U+2028).
    text = response.content.decode("utf-8")
    return [json.loads(line) for line in text.split("\n") if line.strip()]


@schemathesis.hook
def map_case(context, case):
    """A replace (or a patch naming `metadata.name`) names its object twice, in the URL and in `metadata.name`, which must agree
    (else 400). No schema can tie a body field to a path parameter; a client sends the name it
    read. Only well-formed cases are touched, so a malformed name still reaches the server."""
    operation_id = case.operation.definition.raw.get("operationId", "")
    meta = case.meta
    positive = meta is not None and meta.generation.mode.is_positive
    if (
        positive
        and operation_id.startswith(("replace", "patch"))
        and isinstance(case.body, dict)
        and isinstance(case.body.get("metadata"), dict)
        and "name" in case.body["metadata"]
        and case.path_parameters
    ):
        case.body["metadata"]["name"] = case.path_parameters.get("name")
    # The namespace is named twice the same way: by a namespaced path (or, on an un-namespaced
    # one, `default` for one object) and by `metadata.namespace`; a create on a namespaced path
    # must not name another either.
    if (
        positive
        and operation_id.startswith(("replace", "patch", "create"))
        and isinstance(case.body, dict)
        and isinstance(case.body.get("metadata"), dict)
        and "namespace" in case.body["metadata"]
    ):
        path_namespace = (case.path_parameters or {}).get("namespace")
        if path_namespace is not None:
            case.body["metadata"]["namespace"] = path_namespace
        elif not operation_id.startswith("create"):
            case.body["metadata"]["namespace"] = "default"
    return case
