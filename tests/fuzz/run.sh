#!/usr/bin/env bash
# Property-based fuzzing of the HTTP API from its own OpenAPI document, with schemathesis (PyPI):
# starts a server on a free local port with a throwaway data directory and key, runs every check
# over the examples, fuzzing and stateful phases (stateful walks the document's links: create ->
# get -> exec -> snapshot -> delete), fails on any failure, then removes every Docker object the
# server made (found by its own server identity, so nothing else on the daemon is touched).
#
#   bash tests/fuzz/run.sh                   # bounded run, as the test suite does
#   FUZZ_MAX_EXAMPLES=50 bash tests/fuzz/run.sh -- --phases fuzzing   # more cases; args after -- go to schemathesis
#
# Needs Docker, python3 (with venv) and cargo; the test image comes from scripts/build-test-images.sh.
# AGENT_SANDBOX_TEST_RUNTIME (e.g. runsc) becomes the server's AGENT_SANDBOX_DOCKER_RUNTIME.
set -euo pipefail
cd "$(dirname "$0")/../.."

extra=()
if [ "${1:-}" = "--" ]; then
  shift
  extra=("$@")
fi

IMAGE=agent-sandbox-test/busybox:latest
TARGET_DIR=target
MAX_EXAMPLES="${FUZZ_MAX_EXAMPLES:-5}"
say() { printf '[fuzz] %s\n' "$*" >&2; }

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "image $IMAGE is missing: run scripts/build-test-images.sh first"
  exit 1
fi

venv="$TARGET_DIR/fuzz-venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
want=$(sha256sum tests/fuzz/requirements.txt | cut -d' ' -f1)
if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null || true)" != "$want" ]; then
  say "installing tests/fuzz/requirements.txt into $venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/fuzz/requirements.txt
  echo "$want" >"$venv/.requirements.sha256"
fi

say "building agent-sandbox"
cargo build --locked --bin agent-sandbox
bin="${CARGO_TARGET_DIR:-$TARGET_DIR}/debug/agent-sandbox"

work=$(mktemp -d "${TMPDIR:-/tmp}/agent-sandbox-fuzz.XXXXXX")
key=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
server_pid=

cleanup() {
  local status=$? server
  trap - EXIT INT TERM
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  server=$(cat "$work/data/server-id" 2>/dev/null || true)
  if [ -n "$server" ]; then
    # Creates the server sent just before it stopped (a pool of 200 members, say) may still
    # complete in the daemon after the first sweep: sweep until nothing of it is left.
    local filter="label=io.agent-sandbox.server=$server" sweep
    for sweep in $(seq 1 30); do
      docker ps -aq --filter "$filter" | xargs -r docker rm -f -v >/dev/null 2>&1 || true
      docker volume ls -q --filter "$filter" | xargs -r docker volume rm -f >/dev/null 2>&1 || true
      if [ -z "$(docker ps -aq --filter "$filter")" ] && [ -z "$(docker volume ls -q --filter "$filter")" ]; then
        break
      fi
      sleep 2
    done
    if [ -n "$(docker ps -aq --filter "$filter")$(docker volume ls -q --filter "$filter")" ]; then
      say "objects of server $server are still left after the cleanup"
      [ "$status" -ne 0 ] || status=1
    fi
  fi
  # Workspaces with a disk limit are file systems the server mounted under its data directory;
  # a server that is stopped leaves them mounted (it mounts them again when it starts).
  awk -v dir="$work/" 'index($2, dir) == 1 { print $2 }' /proc/mounts | sort -r |
    xargs -r -n1 umount -l 2>/dev/null || true
  mkdir -p "$TARGET_DIR"
  cp "$work/server.log" "$TARGET_DIR/fuzz-server.log" 2>/dev/null || true
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT INT TERM

# Port 0: the server names the port the kernel gave it in its ready line (a port picked here could
# be taken by another suite's server before this one binds it).
AGENT_SANDBOX_PORT=0 AGENT_SANDBOX_DATA_DIR="$work/data" AGENT_SANDBOX_API_KEYS="$key" \
  AGENT_SANDBOX_DEFAULT_IMAGE=$IMAGE AGENT_SANDBOX_ALLOWED_IMAGES=$IMAGE \
  AGENT_SANDBOX_DOCKER_RUNTIME="${AGENT_SANDBOX_TEST_RUNTIME:-}" \
  AGENT_SANDBOX_MAX_CPUS="$(nproc)" AGENT_SANDBOX_MAX_SANDBOXES=8 AGENT_SANDBOX_MAX_EXEC_TIMEOUT_SECONDS=10 \
  AGENT_SANDBOX_DEFAULT_EXEC_TIMEOUT_SECONDS=5 \
  "$bin" serve >"$work/server.log" 2>&1 &
server_pid=$!
if ! port=$(python3 tests/lib/await-server.py "$server_pid" "$work/server.log"); then
  tail -n 50 "$work/server.log" >&2 || true
  exit 1
fi

say "schemathesis against http://127.0.0.1:$port (max $MAX_EXAMPLES examples per operation)"
"$venv/bin/schemathesis" --config-file tests/fuzz/schemathesis.toml run "http://127.0.0.1:$port/openapi.json" \
  -H "Authorization: Bearer $key" \
  --checks all \
  --phases examples,fuzzing,stateful \
  --max-examples "$MAX_EXAMPLES" \
  --request-timeout 30 \
  --max-response-time 30 \
  --seed "${FUZZ_SEED:-1}" \
  --no-color \
  "${extra[@]}"
