//! envd's `filesystem.Filesystem` service: stat, list (with depth), make a directory, move and
//! remove, each one short script run through the data plane as the sandbox user (so it sees
//! and may change exactly what the sandbox user's commands may). Watching a directory is
//! `watch.rs`'s.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use chrono::{DateTime, SecondsFormat, Utc};

use super::envd::{self, dataplane_error};
use crate::api::AppState;
use crate::dataplane::{Command, ExecRequest, SandboxTarget};
use crate::e2b::connect::{Code, RpcError};
use crate::e2b::messages::{
    Empty, EntryInfo, EntryResponse, ListDirRequest, ListDirResponse, MoveRequest, PathRequest,
};
use crate::e2b::paths;
use crate::e2b::protobuf::{self, Schema};

/// One line per entry: type, size, octal mode, symbolic mode, owner, group, mtime, path last (it
/// may hold `|`).
const STAT: &str = "stat -c '%F|%s|%a|%A|%U|%G|%Y|%n'";
/// Exit codes of the scripts, for what they found.
const MISSING: i64 = 44;
const FAILED: i64 = 45;
const NOT_DIRECTORY: i64 = 46;
const EXISTS: i64 = 47;
/// The deepest listing asked for at once.
const MAX_DEPTH: u32 = 32;

async fn run(
    target: &SandboxTarget,
    state: &AppState,
    script: &str,
    args: &[&str],
) -> Result<String, RpcError> {
    let mut argv = vec![
        "sh".to_string(),
        "-c".into(),
        script.to_string(),
        "e2b".into(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    let out = state
        .dataplane
        .exec(
            target,
            ExecRequest {
                command: Command::Argv(argv),
                env: BTreeMap::new(),
                workdir: None,
                timeout_seconds: Some(30.0),
            },
        )
        .await
        .map_err(dataplane_error)?;
    let path = args.first().copied().unwrap_or("");
    match out.exit_code {
        0 if out.truncated => Err(RpcError::new(
            Code::ResourceExhausted,
            format!("the listing of {path} is larger than this server answers at once"),
        )),
        0 => Ok(out.stdout),
        MISSING => Err(RpcError::new(
            Code::NotFound,
            format!("path {path} not found"),
        )),
        NOT_DIRECTORY => Err(RpcError::new(
            Code::InvalidArgument,
            format!("path {path} is not a directory"),
        )),
        EXISTS => Err(RpcError::new(
            Code::AlreadyExists,
            format!("path {path} already exists"),
        )),
        _ => {
            let why = out.stderr.trim();
            let code = if why.contains("ermission denied") || why.contains("Read-only") {
                Code::PermissionDenied
            } else {
                Code::Internal
            };
            Err(RpcError::new(code, format!("{path}: {why}")))
        }
    }
}

/// One line of [`STAT`].
fn entry(line: &str) -> Option<EntryInfo> {
    let mut f = line.splitn(8, '|');
    let (kind, size, octal, symbolic, owner, group, mtime, path) = (
        f.next()?,
        f.next()?,
        f.next()?,
        f.next()?,
        f.next()?,
        f.next()?,
        f.next()?,
        f.next()?,
    );
    let file_type = match kind {
        "directory" => "FILE_TYPE_DIRECTORY",
        "symbolic link" => "FILE_TYPE_SYMLINK",
        k if k.contains("regular") => "FILE_TYPE_FILE",
        _ => "FILE_TYPE_UNSPECIFIED",
    };
    let modified = mtime
        .parse::<i64>()
        .ok()
        .and_then(|s| DateTime::<Utc>::from_timestamp(s, 0))
        .unwrap_or_default();
    let name = path.rsplit('/').next().unwrap_or(path).to_string();
    Some(EntryInfo {
        name,
        file_type,
        path: path.to_string(),
        size: size.to_string(),
        mode: u32::from_str_radix(octal, 8).unwrap_or(0),
        permissions: symbolic.to_string(),
        owner: owner.to_string(),
        group: group.to_string(),
        modified_time: modified.to_rfc3339_opts(SecondsFormat::Secs, true),
        symlink_target: None,
    })
}

/// Stats `path`. A symlink is answered as envd does: with the type of what it leads to (a
/// dangling one stays a symlink) and its target as an absolute path, every link resolved.
async fn stat_path(
    state: &AppState,
    target: &SandboxTarget,
    path: &str,
) -> Result<EntryInfo, RpcError> {
    let script = format!(
        "[ -e \"$1\" ] || [ -L \"$1\" ] || exit {MISSING}; {STAT} -- \"$1\" || exit {FAILED}; \
         if [ -L \"$1\" ]; then readlink -m -- \"$1\"; if [ -e \"$1\" ]; then {STAT} -L -- \"$1\"; fi; fi"
    );
    let out = run(target, state, &script, &[path]).await?;
    let mut lines = out.lines();
    let mut info = lines
        .next()
        .and_then(entry)
        .ok_or_else(|| RpcError::new(Code::Internal, format!("cannot read the stat of {path}")))?;
    if info.file_type == "FILE_TYPE_SYMLINK" {
        info.symlink_target = lines.next().map(str::to_string);
        if let Some(followed) = lines.next().and_then(entry) {
            info.file_type = followed.file_type;
        }
    }
    Ok(info)
}

/// Runs a unary filesystem call on the sandbox its token names, as the SDK's user.
async fn unary<Req, Res, F, Fut>(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    schemas: (&'static Schema, &'static Schema),
    call: F,
) -> Response
where
    Req: serde::de::DeserializeOwned,
    Res: serde::Serialize,
    F: FnOnce(SandboxTarget, Req) -> Fut,
    Fut: std::future::Future<Output = Result<Res, RpcError>>,
{
    let target = async {
        let sandbox = envd::sandbox(state, headers)?;
        envd::check_rpc_user(headers)?;
        envd::data_target(state, sandbox).await
    };
    envd::unary(headers, body, schemas, target, call).await
}

pub async fn stat(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    unary(
        state,
        &headers,
        &body,
        (protobuf::PATH_REQUEST, protobuf::ENTRY_RESPONSE),
        |target, req: PathRequest| async move {
            let entry = stat_path(state, &target, &paths::resolve(&req.path)).await?;
            Ok(EntryResponse { entry })
        },
    )
    .await
}

pub async fn list_dir(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    unary(
        state,
        &headers,
        &body,
        (protobuf::LIST_DIR_REQUEST, protobuf::LIST_DIR_RESPONSE),
        |target, req: ListDirRequest| async move {
            let depth = req.depth.filter(|d| *d > 0).unwrap_or(1);
            if depth > MAX_DEPTH {
                return Err(RpcError::new(
                    Code::InvalidArgument,
                    format!("depth must be at most {MAX_DEPTH}"),
                ));
            }
            let path = paths::resolve(&req.path);
            let script = format!(
                "[ -e \"$1\" ] || exit {MISSING}; [ -d \"$1\" ] || exit {NOT_DIRECTORY}; \
             find \"$1\" -mindepth 1 -maxdepth \"$2\" -exec {STAT} {{}} + || exit {FAILED}"
            );
            let out = run(&target, state, &script, &[&path, &depth.to_string()]).await?;
            let mut entries: Vec<EntryInfo> = out.lines().filter_map(entry).collect();
            entries.sort_by(|a, b| a.path.cmp(&b.path));
            Ok(ListDirResponse { entries })
        },
    )
    .await
}

pub async fn make_dir(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    unary(
        state,
        &headers,
        &body,
        (protobuf::PATH_REQUEST, protobuf::ENTRY_RESPONSE),
        |target, req: PathRequest| async move {
            let path = paths::resolve(&req.path);
            let script = format!(
                "if [ -e \"$1\" ]; then exit {EXISTS}; fi; mkdir -p -- \"$1\" || exit {FAILED}"
            );
            run(&target, state, &script, &[&path]).await?;
            let entry = stat_path(state, &target, &path).await?;
            Ok(EntryResponse { entry })
        },
    )
    .await
}

pub async fn move_entry(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let state = &state;
    unary(
        state,
        &headers,
        &body,
        (protobuf::MOVE_REQUEST, protobuf::ENTRY_RESPONSE),
        |target, req: MoveRequest| async move {
            let (source, destination) = (
                paths::resolve(&req.source),
                paths::resolve(&req.destination),
            );
            let script = format!(
            "[ -e \"$1\" ] || [ -L \"$1\" ] || exit {MISSING}; mv -- \"$1\" \"$2\" || exit {FAILED}"
        );
            run(&target, state, &script, &[&source, &destination]).await?;
            let entry = stat_path(state, &target, &destination).await?;
            Ok(EntryResponse { entry })
        },
    )
    .await
}

pub async fn remove(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    unary(
        state,
        &headers,
        &body,
        (protobuf::PATH_REQUEST, protobuf::EMPTY),
        |target, req: PathRequest| async move {
            let path = paths::resolve(&req.path);
            // As envd: removing what is not there succeeds.
            let script = format!("rm -rf -- \"$1\" || exit {FAILED}");
            run(&target, state, &script, &[&path]).await?;
            Ok(Empty {})
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_become_entries() {
        let e = entry("regular file|5|644|-rw-r--r--|sandbox|sandbox|1700000000|/workspace/a|b")
            .unwrap();
        assert_eq!(e.name, "a|b");
        assert_eq!(e.file_type, "FILE_TYPE_FILE");
        assert_eq!(e.size, "5");
        assert_eq!(e.mode, 0o644);
        assert_eq!(e.modified_time, "2023-11-14T22:13:20Z");
        let d = entry("directory|4096|755|drwxr-xr-x|u|g|0|/workspace/d").unwrap();
        assert_eq!(d.file_type, "FILE_TYPE_DIRECTORY");
        assert!(entry("garbage").is_none());
    }
}
