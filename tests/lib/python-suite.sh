# Shared by the suites that drive a server through a Python client (tests/mcp, tests/e2b): a
# pinned virtual environment, the debug binary, one server on a free local port with a throwaway
# data directory and key, pytest against it, and on exit the server stopped and every sandbox
# container and volume it knew removed (nothing else on the daemon is touched).
#
# A suite's run.sh sets SUITE (its directory under tests/, also the prefix of its messages, venv
# and kept log) and IMAGE (the server's default image), optionally REQUIREMENTS (default
# tests/$SUITE/requirements.txt), sources this file, and calls
#   suite_args "$@"; suite_prepare; suite_serve [SETTING=value ...]; suite_pytest [VAR=value ...]
# Anything after `--` in its arguments goes to pytest.

LABEL=io.agent-sandbox.managed=true
TARGET_DIR=target
VENV="$TARGET_DIR/$SUITE-venv"
REQUIREMENTS="${REQUIREMENTS:-tests/$SUITE/requirements.txt}"
pytest_args=()
server_pid=
work=
server_log=

say() { printf '[%s] %s\n' "$SUITE" "$*" >&2; }

suite_args() {
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
}

# The image, the venv with $REQUIREMENTS (reinstalled when it changes), the binary.
suite_prepare() {
  if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "image $IMAGE is missing: run scripts/build-test-images.sh --python first"
    exit 1
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    python3 -m venv "$VENV"
  fi
  local want
  want=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
  if [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null || true)" != "$want" ]; then
    say "installing $REQUIREMENTS into $VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
    echo "$want" >"$VENV/.requirements.sha256"
  fi
  PYTHON="$VENV/bin/python"
  say "building agent-sandbox"
  cargo build --locked --bin agent-sandbox
  BINARY="${CARGO_TARGET_DIR:-$TARGET_DIR}/debug/agent-sandbox"
  # An absolute path stays as it is (a CARGO_TARGET_DIR elsewhere); a relative one is from here.
  [[ "$BINARY" = /* ]] || BINARY="$(pwd)/$BINARY"
  work=$(mktemp -d "${TMPDIR:-/tmp}/agent-sandbox-$SUITE.XXXXXX")
  server_log="$work/server.log"
  trap suite_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

suite_cleanup() {
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
  # Only the sandboxes this run's server knew (its log and data directory name them).
  ids=$(
    {
      grep -oE 'sb_[0-9a-f]{16}' "$server_log" 2>/dev/null || true
      ls "$work/data/manifests/sandboxes" 2>/dev/null | sed 's/\.yaml$//' || true
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
  cp "$server_log" "$TARGET_DIR/$SUITE-server.log" 2>/dev/null || true
  rm -rf "$work"
  exit "$status"
}

# Starts the server with the suite's settings plus the given ones (none of the caller's
# AGENT_SANDBOX_* or E2B_* variables reach it or the tests), and waits for /healthz. Sets port
# and key.
suite_serve() {
  key=$("$PYTHON" -c 'import secrets; print(secrets.token_hex(16))')
  local server_env=(
    AGENT_SANDBOX_HOST=127.0.0.1
    AGENT_SANDBOX_PORT=0
    AGENT_SANDBOX_DATA_DIR="$work/data"
    AGENT_SANDBOX_API_KEYS="$key"
    AGENT_SANDBOX_DEFAULT_IMAGE="$IMAGE"
    AGENT_SANDBOX_ALLOWED_IMAGES='agent-sandbox-test/*'
    AGENT_SANDBOX_REAP_INTERVAL_SECONDS=1
    "$@"
  )
  if [ -n "${AGENT_SANDBOX_TEST_RUNTIME:-}" ]; then
    server_env+=(AGENT_SANDBOX_DOCKER_RUNTIME="$AGENT_SANDBOX_TEST_RUNTIME")
  fi
  unset_env=()
  local name
  for name in $(compgen -e); do
    case "$name" in AGENT_SANDBOX_* | E2B_*) unset_env+=(-u "$name") ;; esac
  done
  say "starting the server"
  env "${unset_env[@]}" "${server_env[@]}" "$BINARY" serve >"$server_log" 2>&1 &
  server_pid=$!
  # Port 0: the server names the port the kernel gave it in its ready line. A port picked here
  # could be taken by another suite's server before this one binds it.
  if ! port=$("$PYTHON" tests/lib/await-server.py "$server_pid" "$server_log"); then
    say "server log:"
    tail -n 50 "$server_log" >&2 || true
    exit 1
  fi
  say "the server listens on 127.0.0.1:$port"
}

# Runs pytest on tests/$SUITE with the given variables; exits with its status (collecting no
# tests is a failure).
suite_pytest() {
  local status
  set +e
  env "${unset_env[@]}" "$@" PYTHONDONTWRITEBYTECODE=1 \
    "$PYTHON" -m pytest -p no:cacheprovider --rootdir "tests/$SUITE" -ra "tests/$SUITE" \
    "${pytest_args[@]}"
  status=$?
  set -e
  if [ "$status" -eq 5 ]; then
    say "pytest collected no tests: that is a failure"
  elif [ "$status" -ne 0 ]; then
    say "failed; the server's log is kept in $TARGET_DIR/$SUITE-server.log"
  fi
  exit "$status"
}
