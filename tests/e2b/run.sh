#!/usr/bin/env bash
# E2B suite: starts a server on a free local port with a throwaway data directory and key, drives
# it through E2B's published Python SDK (tests/e2b/test_e2b.py, pinned in requirements.txt) with
# only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing it here, then stops the server and
# removes every sandbox container and volume the run created.
#
#   bash tests/e2b/run.sh                  # everything
#   bash tests/e2b/run.sh -- -k files      # anything after -- goes to pytest
#
# Needs Docker, python3 (with venv) and cargo; the test image (with bash, which the SDK runs
# commands with) comes from `scripts/build-test-images.sh --python`. AGENT_SANDBOX_TEST_RUNTIME
# (e.g. runsc) becomes the server's AGENT_SANDBOX_DOCKER_RUNTIME.
set -euo pipefail
cd "$(dirname "$0")/../.."

pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help)
      sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
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

IMAGE=agent-sandbox-test/python:latest
LABEL=io.agent-sandbox.managed=true
TARGET_DIR=target
VENV="$TARGET_DIR/e2b-venv"

say() { printf '[e2b] %s\n' "$*" >&2; }

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "image $IMAGE is missing: run scripts/build-test-images.sh --python first"
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  python3 -m venv "$VENV"
fi
want=$(sha256sum tests/e2b/requirements.txt | cut -d' ' -f1)
if [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null || true)" != "$want" ]; then
  say "installing tests/e2b/requirements.txt into $VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r tests/e2b/requirements.txt
  echo "$want" >"$VENV/.requirements.sha256"
fi
PYTHON="$VENV/bin/python"

say "building agent-sandbox"
cargo build --locked --bin agent-sandbox
BINARY="${CARGO_TARGET_DIR:-$TARGET_DIR}/debug/agent-sandbox"

work=$(mktemp -d "${TMPDIR:-/tmp}/agent-sandbox-e2b.XXXXXX")
server_log="$work/server.log"
server_pid=

cleanup() {
  local status=$? ids
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
  # The sandboxes this run's server created (named in its log); nothing else is touched.
  ids=$(grep -oE 'sb_[0-9a-f]{16}' "$server_log" 2>/dev/null | sort -u || true)
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
  if [ -s "$work/data/server-id" ]; then
    docker volume ls -q --filter "label=io.agent-sandbox.heartbeat=$(cat "$work/data/server-id")" |
      xargs -r docker volume rm -f >/dev/null 2>&1 || true
  fi
  mkdir -p "$TARGET_DIR"
  cp "$server_log" "$TARGET_DIR/e2b-server.log" 2>/dev/null || true
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
key=$("$PYTHON" -c 'import secrets; print(secrets.token_hex(16))')

server_env=(
  AGENT_SANDBOX_HOST=127.0.0.1
  AGENT_SANDBOX_PORT="$port"
  AGENT_SANDBOX_DATA_DIR="$work/data"
  AGENT_SANDBOX_API_KEYS="$key"
  AGENT_SANDBOX_DEFAULT_IMAGE="$IMAGE"
  AGENT_SANDBOX_ALLOWED_IMAGES='agent-sandbox-test/*'
  AGENT_SANDBOX_ALLOW_NETWORK=true
  AGENT_SANDBOX_REAP_INTERVAL_SECONDS=1
)
if [ -n "${AGENT_SANDBOX_TEST_RUNTIME:-}" ]; then
  server_env+=(AGENT_SANDBOX_DOCKER_RUNTIME="$AGENT_SANDBOX_TEST_RUNTIME")
fi
unset_env=()
for name in $(compgen -e); do
  case "$name" in AGENT_SANDBOX_* | E2B_*) unset_env+=(-u "$name") ;; esac
done

say "starting the server on 127.0.0.1:$port"
env "${unset_env[@]}" "${server_env[@]}" "$BINARY" serve >"$server_log" 2>&1 &
server_pid=$!

if ! "$PYTHON" - "$port" "$server_pid" <<'PY'; then
import os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("the server exited before it answered /healthz")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.2)
sys.exit("the server did not answer /healthz within 120 s")
PY
  say "server log:"
  tail -n 50 "$server_log" >&2 || true
  exit 1
fi

set +e
env "${unset_env[@]}" \
  E2B_API_URL="http://127.0.0.1:$port/e2b" \
  E2B_SANDBOX_URL="http://127.0.0.1:$port/e2b/envd" \
  E2B_API_KEY="$key" \
  E2B_TEST_SERVER="http://127.0.0.1:$port" \
  PYTHONDONTWRITEBYTECODE=1 \
  "$PYTHON" -m pytest -p no:cacheprovider --rootdir tests/e2b -ra tests/e2b "${pytest_args[@]}"
status=$?
set -e

if [ "$status" -eq 5 ]; then
  say "pytest collected no tests: that is a failure"
elif [ "$status" -ne 0 ]; then
  say "failed; the server's log is kept in $TARGET_DIR/e2b-server.log"
fi
exit "$status"
