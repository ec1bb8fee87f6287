#!/usr/bin/env bash
# Benchmark: our server against the reference server (agent-sandbox 0.2.1 from PyPI) on the same
# Docker daemon and image, plus the measurements only ours can take (manifests, pools, forks,
# a 1 GiB snapshot and its archive's export and import against tar, the idle cost of 1,000
# declared sandboxes).
#
#   bash bench/run.sh                 # full run: 20 iterations per operation
#   bash bench/run.sh --quick         # 5 iterations, small scale tests
#   bash bench/run.sh -- --only create,dataplane   # anything after -- goes to bench/bench.py
#
# Needs Docker, python3 (with venv) and cargo. Builds the release binary, installs the reference
# and httpx into target/bench-venv, starts both servers on free loopback ports with throwaway data
# directories and keys, runs bench/bench.py, stops both and removes every container and volume
# either of them left. The report goes to stdout and to target/bench/report.md (raw samples in
# target/bench/results.json, server logs beside them).
set -euo pipefail
cd "$(dirname "$0")/.."

bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) bench_args+=(--quick) ;;
    -h | --help)
      sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    --)
      shift
      bench_args+=("$@")
      break
      ;;
    *) bench_args+=("$1") ;;
  esac
  shift
done

IMAGE=agent-sandbox-test/busybox:latest
LABEL=io.agent-sandbox.managed=true
TARGET_DIR=${CARGO_TARGET_DIR:-target}
OUT_DIR=target/bench
VENV=target/bench-venv
# A resync inside the idle measurement window, so its cost (and any Docker writes) is counted.
RESYNC_SECONDS=30

say() { printf '[bench] %s\n' "$*" >&2; }

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "building the test images"
  bash scripts/build-test-images.sh
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  python3 -m venv "$VENV"
fi
want=$(sha256sum bench/requirements.txt | cut -d' ' -f1)
if [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null || true)" != "$want" ]; then
  say "installing bench/requirements.txt into $VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r bench/requirements.txt
  echo "$want" >"$VENV/.requirements.sha256"
fi
PYTHON="$VENV/bin/python"

if [ -n "${BENCH_OURS_BIN:-}" ]; then
  OURS_BIN=$BENCH_OURS_BIN # a binary built some other way, for trying the harness itself
else
  # The memory-tuned profile packaging uses (fat LTO, one codegen unit): the figures in
  # docs/benchmarks.md come from it.
  say "building agent-sandbox (profile dist)"
  cargo build --profile dist --locked --bin agent-sandbox
  OURS_BIN="$TARGET_DIR/dist/agent-sandbox"
fi

mkdir -p "$OUT_DIR"
# On the data disk (not a tmpfs), so that snapshots and the plain-tar baseline write to the same disk.
work=$(mktemp -d "$PWD/$OUT_DIR/run.XXXXXX")
ref_pid= ours_pid=

free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
new_key() { "$PYTHON" -c 'import secrets; print(secrets.token_hex(16))'; }

stop() {
  local pid=$1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 120); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local status=$? server_id ids
  trap - EXIT INT TERM
  stop "$ours_pid"
  stop "$ref_pid"
  # Ours: everything carrying this server's identity.
  server_id=$(cat "$work/ours/server-id" 2>/dev/null || true)
  if [ -n "$server_id" ]; then
    docker ps -aq --filter "label=io.agent-sandbox.server=$server_id" | xargs -r docker rm -f -v >/dev/null || true
    docker volume ls -q --filter "label=io.agent-sandbox.server=$server_id" | xargs -r docker volume rm -f >/dev/null || true
  fi
  # The Docker-alone measurements label what they make.
  docker ps -aq --filter "label=io.agent-sandbox.bench=docker-floor" | xargs -r docker rm -f -v >/dev/null || true
  docker volume ls -q --filter "label=io.agent-sandbox.bench=docker-floor" | xargs -r docker volume rm -f >/dev/null || true
  # The reference: the sandboxes its records or its log name, by its naming scheme, and only
  # objects that carry no server identity (which ours always do).
  ids=$(
    {
      ls "$work/ref/sandboxes" 2>/dev/null | sed -n 's/\.json$//p'
      grep -oE 'sb_[0-9a-f]{16}' "$work/ref.log" 2>/dev/null || true
    } | sort -u
  )
  for id in $ids; do
    if docker inspect --format '{{index .Config.Labels "io.agent-sandbox.server"}}' "agent-sandbox-$id" 2>/dev/null | grep -qx ''; then
      docker rm -f -v "agent-sandbox-$id" >/dev/null 2>&1 || true
    fi
    if docker volume inspect --format '{{index .Labels "io.agent-sandbox.server"}}' "agent-sandbox-$id-workspace" 2>/dev/null | grep -qx ''; then
      docker volume rm -f "agent-sandbox-$id-workspace" >/dev/null 2>&1 || true
    fi
  done
  cp "$work/ref.log" "$OUT_DIR/reference-server.log" 2>/dev/null || true
  cp "$work/ours.log" "$OUT_DIR/ours-server.log" 2>/dev/null || true
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_healthy() {
  "$PYTHON" - "$1" "$2" <<'EOF'
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
EOF
}

unset_env=()
for name in $(compgen -e); do
  case "$name" in AGENT_SANDBOX_*) unset_env+=(-u "$name") ;; esac
done
# Same settings for both servers; limits roomy enough for every measurement.
common_env=(
  AGENT_SANDBOX_HOST=127.0.0.1
  AGENT_SANDBOX_DEFAULT_IMAGE="$IMAGE"
  AGENT_SANDBOX_ALLOWED_IMAGES='agent-sandbox-test/*'
  AGENT_SANDBOX_MAX_SANDBOXES=100
  AGENT_SANDBOX_MAX_SNAPSHOT_BYTES=4294967296
)

ref_port=$(free_port) ref_key=$(new_key)
ours_port=$(free_port) ours_key=$(new_key)

# The reference first: its startup sweep (turned off in bench/reference_server.py) would otherwise
# run against ours.
say "starting the reference server on 127.0.0.1:$ref_port"
env "${unset_env[@]}" "${common_env[@]}" AGENT_SANDBOX_PORT="$ref_port" AGENT_SANDBOX_API_KEYS="$ref_key" \
  AGENT_SANDBOX_DATA_DIR="$work/ref" \
  "$PYTHON" bench/reference_server.py serve >"$work/ref.log" 2>&1 &
ref_pid=$!
wait_healthy "$ref_port" "$ref_pid" || { tail -n 30 "$work/ref.log" >&2; exit 1; }

start_ours() {
  say "starting our server on 127.0.0.1:$ours_port"
  env "${unset_env[@]}" "${common_env[@]}" AGENT_SANDBOX_PORT="$ours_port" AGENT_SANDBOX_API_KEYS="$ours_key" \
    AGENT_SANDBOX_DATA_DIR="$work/ours" AGENT_SANDBOX_RESYNC_SECONDS="$RESYNC_SECONDS" \
    "$OURS_BIN" serve >>"$work/ours.log" 2>&1 &
  ours_pid=$!
  wait_healthy "$ours_port" "$ours_pid" || { tail -n 30 "$work/ours.log" >&2; exit 1; }
}
start_ours

bench() {
  PYTHONDONTWRITEBYTECODE=1 "$PYTHON" bench/bench.py \
    --ours-url "http://127.0.0.1:$ours_port" --ours-key "$ours_key" --ours-pid "$ours_pid" \
    --ours-bin "$OURS_BIN" \
    --ours-data "$work/ours" \
    --ref-url "http://127.0.0.1:$ref_port" --ref-key "$ref_key" \
    --image "$IMAGE" --work "$work" --resync-seconds "$RESYNC_SECONDS" "$@"
}

if printf '%s\n' "${bench_args[@]}" | grep -qx -- '--only'; then
  bench --json "$OUT_DIR/results.json" --markdown "$OUT_DIR/report.md" "${bench_args[@]}"
  exit 0
fi
# The idle measurement gets a freshly started server (same data directory), so that memory kept
# from the earlier measurements (a 1 GiB snapshot, say) is not counted as the cost of idling.
bench --skip idle --json "$work/phase1.json" "${bench_args[@]}" >/dev/null
stop "$ours_pid"
start_ours
bench --only idle --merge "$work/phase1.json" \
  --json "$OUT_DIR/results.json" --markdown "$OUT_DIR/report.md" "${bench_args[@]}"
