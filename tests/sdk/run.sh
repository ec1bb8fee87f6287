#!/usr/bin/env bash
# Compatibility suite: starts a server on a free local port with a throwaway data directory and key,
# drives it through the published Python SDK of agent-sandbox 0.2.1 (tests/sdk/test_sdk.py), then
# stops it and removes every sandbox container and volume the run created.
#
#   bash tests/sdk/run.sh                    # against our server (target/debug/agent-sandbox)
#   bash tests/sdk/run.sh --reference        # against the reference server, to prove the suite itself
#   bash tests/sdk/run.sh -- -m snapshots    # anything after -- goes to pytest
#
# Needs Docker, python3 (with venv) and, for our server, cargo; the test image comes from
# scripts/build-test-images.sh. AGENT_SANDBOX_TEST_RUNTIME (e.g. runsc) becomes the server's
# AGENT_SANDBOX_DOCKER_RUNTIME.
#
# The reference server removes, when it starts, every labeled sandbox container and volume on the
# daemon that it does not know (ours only collects objects carrying its own server identity), so a
# --reference run waits until no other sandbox objects are left before it starts.
set -euo pipefail
cd "$(dirname "$0")/../.."

mode=ours
pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --reference) mode=reference ;;
    -h | --help)
      sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    --)
      shift
      pytest_args+=("$@")
      break
      ;;
    *) pytest_args+=("$1") ;;
  esac
  shift
done

IMAGE=agent-sandbox-test/busybox:latest
LABEL=io.agent-sandbox.managed=true
# Small enough that a test can cross them cheaply, large enough for everything else the suite does.
MAX_SANDBOXES=8
MAX_EXEC_OUTPUT_BYTES=65536
WAIT_FOR_DAEMON_SECONDS="${SDK_WAIT_FOR_DAEMON_SECONDS:-300}"
TARGET_DIR=target

say() { printf '[sdk] %s\n' "$*" >&2; }

# ensure_venv DIR REQUIREMENTS: create the venv if missing and install when the requirements changed.
ensure_venv() {
  local venv=$1 requirements=$2 want
  if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv"
    python3 -m venv "$venv"
  fi
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null || true)" != "$want" ]; then
    say "installing $requirements into $venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    echo "$want" >"$venv/.requirements.sha256"
  fi
}

# Sandbox containers and volumes (the shared helper volume carries no sandbox ID and is left alone).
sandbox_object_count() {
  {
    docker ps -aq --filter "label=$LABEL" --filter label=io.agent-sandbox.id
    docker volume ls -q --filter "label=$LABEL" --filter label=io.agent-sandbox.id
  } | wc -l
}

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "image $IMAGE is missing: run scripts/build-test-images.sh first"
  exit 1
fi

ensure_venv "$TARGET_DIR/sdk-venv" tests/sdk/requirements.txt
PYTHON="$TARGET_DIR/sdk-venv/bin/python"

if [ "$mode" = reference ]; then
  ensure_venv "$TARGET_DIR/ref-venv" tests/sdk/reference-requirements.txt
  server_cmd=("$TARGET_DIR/ref-venv/bin/agent-sandbox" serve)
else
  say "building agent-sandbox"
  cargo build --locked --bin agent-sandbox
  server_cmd=("${CARGO_TARGET_DIR:-$TARGET_DIR}/debug/agent-sandbox" serve)
fi

waited=0
while [ "$mode" = reference ] && [ "$(sandbox_object_count)" -gt 0 ]; do
  if [ "$waited" -ge "$WAIT_FOR_DAEMON_SECONDS" ]; then
    say "sandbox containers or volumes are still on the daemon; the reference server would remove them."
    say "Remove them or wait for whatever owns them, then run again."
    exit 1
  fi
  [ "$waited" -eq 0 ] && say "waiting for the sandbox containers and volumes of another server to go away"
  sleep 5
  waited=$((waited + 5))
done

work=$(mktemp -d "${TMPDIR:-/tmp}/agent-sandbox-sdk.XXXXXX")
ids_file="$work/sandbox-ids"
server_log="$work/server.log"
: >"$ids_file"
server_pid=

cleanup() {
  local status=$? ids id
  trap - EXIT INT TERM
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 60); do
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.25
    done
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  # Sandboxes the suite saw, plus any the server's log names (one created by a test that then failed
  # before it could record it). Nothing else on the daemon is touched.
  ids=$(
    {
      cat "$ids_file"
      grep -oE 'sb_[0-9a-f]{16}' "$server_log" 2>/dev/null || true
    } | sort -u
  )
  if [ -n "$ids" ]; then
    docker ps -a --filter "label=$LABEL" --format '{{.ID}} {{.Label "io.agent-sandbox.id"}}' |
      while read -r cid id; do
        if grep -qxF -- "$id" <<<"$ids"; then docker rm -f -v "$cid" >/dev/null || true; fi
      done
    docker volume ls --filter "label=$LABEL" --format '{{.Name}} {{.Label "io.agent-sandbox.id"}}' |
      while read -r name id; do
        if grep -qxF -- "$id" <<<"$ids"; then docker volume rm -f "$name" >/dev/null || true; fi
      done
  fi
  # The server's heartbeat (see `agent-sandbox gc`), by its identity.
  if [ -s "$work/data/server-id" ]; then
    docker volume ls -q --filter "label=io.agent-sandbox.heartbeat=$(cat "$work/data/server-id")" |
      xargs -r docker volume rm -f >/dev/null 2>&1 || true
  fi
  mkdir -p "$TARGET_DIR"
  cp "$server_log" "$TARGET_DIR/sdk-$mode-server.log" 2>/dev/null || true
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Ours is told port 0 and names its port in its ready line; the reference server gets a port picked
# here, which tests/lib/await-server.py then checks the server itself holds.
port=0
port_arg=()
if [ "$mode" = reference ]; then
  port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  port_arg=("$port")
fi
key=$("$PYTHON" -c 'import secrets; print(secrets.token_hex(16))')

# The server sees only the settings chosen here, not whatever AGENT_SANDBOX_* the caller has set.
server_env=(
  AGENT_SANDBOX_HOST=127.0.0.1
  AGENT_SANDBOX_PORT="$port"
  AGENT_SANDBOX_DATA_DIR="$work/data"
  AGENT_SANDBOX_API_KEYS="$key"
  AGENT_SANDBOX_DEFAULT_IMAGE="$IMAGE"
  AGENT_SANDBOX_ALLOWED_IMAGES='agent-sandbox-test/*'
  AGENT_SANDBOX_REAP_INTERVAL_SECONDS=1
  AGENT_SANDBOX_MAX_SANDBOXES="$MAX_SANDBOXES"
  AGENT_SANDBOX_MAX_EXEC_OUTPUT_BYTES="$MAX_EXEC_OUTPUT_BYTES"
)
if [ -n "${AGENT_SANDBOX_TEST_RUNTIME:-}" ]; then
  server_env+=(AGENT_SANDBOX_DOCKER_RUNTIME="$AGENT_SANDBOX_TEST_RUNTIME")
fi
unset_env=()
for name in $(compgen -e); do
  case "$name" in AGENT_SANDBOX_*) unset_env+=(-u "$name") ;; esac
done

say "starting the $mode server"
env "${unset_env[@]}" "${server_env[@]}" "${server_cmd[@]}" >"$server_log" 2>&1 &
server_pid=$!

if ! port=$("$PYTHON" tests/lib/await-server.py "$server_pid" "$server_log" "${port_arg[@]}"); then
  say "server log:"
  tail -n 50 "$server_log" >&2 || true
  exit 1
fi
say "the $mode server listens on 127.0.0.1:$port"

set +e
env "${unset_env[@]}" \
  AGENT_SANDBOX_URL="http://127.0.0.1:$port" \
  AGENT_SANDBOX_API_KEY="$key" \
  PYTHONDONTWRITEBYTECODE=1 \
  SDK_TEST_TARGET="$mode" \
  SDK_TEST_IDS_FILE="$ids_file" \
  SDK_TEST_DEFAULT_IMAGE="$IMAGE" \
  SDK_TEST_MAX_SANDBOXES="$MAX_SANDBOXES" \
  SDK_TEST_MAX_EXEC_OUTPUT_BYTES="$MAX_EXEC_OUTPUT_BYTES" \
  "$PYTHON" -m pytest -p no:cacheprovider --rootdir tests/sdk -ra tests/sdk "${pytest_args[@]}"
status=$?
set -e

if [ "$status" -eq 5 ]; then
  say "pytest collected no tests: that is a failure"
elif [ "$status" -ne 0 ]; then
  say "failed; the server's log is kept in $TARGET_DIR/sdk-$mode-server.log"
fi
exit "$status"
