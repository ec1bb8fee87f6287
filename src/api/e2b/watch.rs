//! envd's directory watching (`filesystem.Filesystem`'s `WatchDir`, a server stream, and the
//! polling calls `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher`) on the sandbox's own
//! inotify watchers (`crate::watches`), for any directory the sandbox user may read. A watcher's
//! ID is the supervisor's (`w_…`). Entry info in events (`include_entry`, envd 0.6.3) is not
//! sent; the SDK does not ask for it from the envd version served here.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use super::envd;
use super::process::{keepalive, target};
use crate::api::AppState;
use crate::e2b::connect::{self, Code, Encoding, RpcError};
use crate::e2b::messages::{
    CreateWatcherResponse, Empty, FilesystemEvent, GetWatcherEventsResponse, WatchDirResponse,
    WatchRequest, WatcherRequest,
};
use crate::e2b::paths;
use crate::e2b::protobuf;
use crate::watches::{self, Event, Item, Op, WatchError};

fn watch_error(e: WatchError) -> RpcError {
    let code = match &e {
        WatchError::NotFound(_) => Code::NotFound,
        WatchError::Invalid(_) => Code::InvalidArgument,
        WatchError::Denied(_) => Code::PermissionDenied,
        WatchError::TooMany(_) => Code::ResourceExhausted,
        WatchError::Unavailable(_) => Code::Unavailable,
        WatchError::Backend(_) => Code::Internal,
    };
    RpcError::new(code, e.to_string())
}

fn wire(event: Event) -> FilesystemEvent {
    FilesystemEvent {
        name: event.name,
        event_type: match event.op {
            Op::Create => "EVENT_TYPE_CREATE",
            Op::Write => "EVENT_TYPE_WRITE",
            Op::Remove => "EVENT_TYPE_REMOVE",
            Op::Rename => "EVENT_TYPE_RENAME",
            Op::Chmod => "EVENT_TYPE_CHMOD",
        },
    }
}

fn check(req: &WatchRequest) -> Result<String, RpcError> {
    if req.path.is_empty() {
        return Err(RpcError::new(Code::InvalidArgument, "path is required"));
    }
    Ok(paths::resolve(&req.path))
}

pub async fn watch_dir(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let encoding = connect::stream_encoding(&headers);
    let begun = async {
        let target = target(&state, &headers).await?;
        let request: WatchRequest =
            connect::stream_request(&headers, &body, protobuf::WATCH_REQUEST)?;
        let path = check(&request)?;
        watches::stream(&state.processes, &target, &path, request.recursive)
            .await
            .map_err(watch_error)
    }
    .await;
    match begun {
        Ok(items) => stream_events(items, keepalive(&headers), encoding),
        Err(e) => connect::stream_error(e, encoding),
    }
}

/// The start event, the events as they come, keep-alives while it is quiet, and the end of the
/// stream with the error that ended the watch. The client going away drops the watch.
fn stream_events(
    items: futures::stream::BoxStream<'static, Item>,
    ping: Duration,
    encoding: Encoding,
) -> Response {
    let schema = protobuf::WATCH_DIR_RESPONSE;
    let first = connect::envelope(&WatchDirResponse::Start(Empty {}), encoding, schema);
    let rest = futures::stream::unfold(Some(items), move |items| async move {
        let mut items = items?;
        match tokio::time::timeout(ping, items.next()).await {
            Err(_) => {
                let alive = WatchDirResponse::Keepalive(Empty {});
                Some((connect::envelope(&alive, encoding, schema), Some(items)))
            }
            Ok(Some(Item::Event(event))) => {
                let event = WatchDirResponse::Filesystem(wire(event));
                Some((connect::envelope(&event, encoding, schema), Some(items)))
            }
            Ok(Some(Item::Failed(e))) => {
                Some((connect::end_of_stream(Some(&watch_error(e))), None))
            }
            Ok(None) => Some((connect::end_of_stream(None), None)),
        }
    });
    let body = futures::stream::once(async move { first })
        .chain(rest)
        .map(Ok::<_, std::convert::Infallible>);
    (connect::stream_headers(encoding), Body::from_stream(body)).into_response()
}

pub async fn create_watcher(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let state = &state;
    envd::unary(
        &headers,
        &body,
        (protobuf::WATCH_REQUEST, protobuf::WATCHER_ID),
        target(state, &headers),
        |target, req: WatchRequest| async move {
            let path = check(&req)?;
            let id = watches::create(&state.processes, &target, &path, req.recursive)
                .await
                .map_err(watch_error)?;
            Ok(CreateWatcherResponse { watcher_id: id })
        },
    )
    .await
}

fn watcher_id(req: &WatcherRequest) -> Result<&str, RpcError> {
    if req.watcher_id.is_empty() {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "watcherId is required",
        ));
    }
    Ok(&req.watcher_id)
}

pub async fn get_watcher_events(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let state = &state;
    envd::unary(
        &headers,
        &body,
        (protobuf::WATCHER_ID, protobuf::WATCHER_EVENTS_RESPONSE),
        target(state, &headers),
        |target, req: WatcherRequest| async move {
            let events = watches::events(&state.processes, &target, watcher_id(&req)?)
                .await
                .map_err(watch_error)?;
            Ok(GetWatcherEventsResponse {
                events: events.into_iter().map(wire).collect(),
            })
        },
    )
    .await
}

pub async fn remove_watcher(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let state = &state;
    envd::unary(
        &headers,
        &body,
        (protobuf::WATCHER_ID, protobuf::EMPTY),
        target(state, &headers),
        |target, req: WatcherRequest| async move {
            watches::remove(&state.processes, &target, watcher_id(&req)?)
                .await
                .map_err(watch_error)?;
            Ok(Empty {})
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_errors_have_their_connect_codes_and_events_their_names() {
        assert_eq!(
            watch_error(WatchError::NotFound("path /x not found".into())).code,
            Code::NotFound
        );
        assert_eq!(
            watch_error(WatchError::TooMany("events were lost".into())).code,
            Code::ResourceExhausted
        );
        assert_eq!(
            watch_error(WatchError::Denied("no".into())).code,
            Code::PermissionDenied
        );
        let e = wire(Event {
            op: Op::Rename,
            name: "a".into(),
        });
        assert_eq!(e.event_type, "EVENT_TYPE_RENAME");
    }
}
