#!/usr/bin/env bash
# Install gVisor and register it with the local Docker daemon as the runtime "runsc", then check
# that a container runs with `--runtime runsc`. Idempotent.
#
# The release must have gVisor's systrap platform (gVisor 2023 and later). Debian bookworm's own
# runsc (release 20221219) has only ptrace and kvm, and both fail a sandbox here: under ptrace every
# address space keeps one host stub thread per sentry thread that ever ran it, so host threads grow
# as processes x sentry threads (measured: about 1,360 after 55 short busy processes within a pids
# limit of 64, against about 150 under systrap) until the container's pids cgroup refuses one and
# the whole gVisor sandbox dies; kvm hangs at boot on these machines (their /dev/kvm is the
# paravirtual PVM module, /sys/module/kvm_pvm, which gVisor cannot drive). So when the runsc on
# PATH lacks systrap, the runsc package of the next Debian release (GVISOR_SUITE, default trixie:
# release 20240729) is downloaded with a private apt configuration (the machine's apt sources
# are not touched) and its static binary installed as RUNSC_DIR/runsc; Debian's /usr/bin/runsc
# stays as it is. Without network access to that suite it falls back to the runsc on PATH (or
# bookworm's package) with a warning: process storms can then still restart a gVisor sandbox.
#
# The runtime is registered with `runtimeArgs: ["--network=host", "--platform=systrap",
# "--overlay2=none"]` (the last two where the release has them; see below for the overlay): gVisor's
# own network stack refuses to start here ("cannot run with network enabled in root network
# namespace"), while --network=host makes it use the network namespace Docker prepared, so a
# `--network none` container sees only `lo` and a bridge container its own `eth0` (served by the
# host kernel). Measured here: Docker's seccomp profile is not applied inside gVisor (runsc's
# --oci-seccomp is off; gVisor itself is the syscall boundary). The daemon is reloaded with SIGHUP
# (or `systemctl reload docker` under systemd); running containers are not touched: each keeps the
# runsc binary it was started with.
#
# Usage: scripts/install-runsc.sh [--help]
# Environment: RUNSC_NAME (default runsc), RUNSC_ARGS (JSON array; default ["--network=host",
#              "--platform=systrap", "--overlay2=none"], less what the release lacks),
#              GVISOR_SUITE (default trixie), RUNSC_DIR (default /usr/local/lib/agent-sandbox),
#              DAEMON_JSON (default /etc/docker/daemon.json), TEST_IMAGE (default
#              agent-sandbox-test/busybox:latest; built with scripts/build-test-images.sh if missing).
set -euo pipefail

RUNSC_NAME="${RUNSC_NAME:-runsc}"
GVISOR_SUITE="${GVISOR_SUITE:-trixie}"
RUNSC_DIR="${RUNSC_DIR:-/usr/local/lib/agent-sandbox}"
DAEMON_JSON="${DAEMON_JSON:-/etc/docker/daemon.json}"
TEST_IMAGE="${TEST_IMAGE:-agent-sandbox-test/busybox:latest}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

case "${1:-}" in
    "") ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (try --help)" >&2; exit 2 ;;
esac

log() { printf '[install-runsc] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root"
command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "cannot reach the Docker daemon"

# 1. A gVisor release with the systrap platform.
has_systrap() { "$1" flags 2>&1 | grep systrap >/dev/null; }

# Downloads GVISOR_SUITE's runsc package into a private apt tree and installs its binary as
# RUNSC_DIR/runsc. Nothing of the machine's apt configuration or package database changes.
fetch_runsc() {
    local tree deb
    tree="$(mktemp -d)"
    # apt drops privileges to _apt for downloads: the tree must be readable and writable by it.
    chmod 0755 "$tree"
    mkdir -p "$tree/lists/partial" "$tree/cache/archives/partial"
    chown -R _apt "$tree/lists" "$tree/cache" 2>/dev/null || true
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $GVISOR_SUITE main" >"$tree/sources.list"
    local apt=(-o "Dir::Etc::SourceList=$tree/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$tree/lists" -o "Dir::Cache=$tree/cache" -o Debug::NoLocking=1)
    if ! apt-get "${apt[@]}" update -qq >"$tree/log" 2>&1 ||
        ! (cd "$tree" && apt-get "${apt[@]}" download runsc >>"$tree/log" 2>&1); then
        log "could not fetch runsc from Debian $GVISOR_SUITE: $(tail -n 2 "$tree/log" | tr '\n' ' ')"
        rm -rf "$tree"
        return 1
    fi
    deb="$(ls "$tree"/runsc_*.deb 2>/dev/null | head -n1)"
    if [ -z "$deb" ] || ! dpkg-deb -x "$deb" "$tree/x" || ! has_systrap "$tree/x/usr/bin/runsc"; then
        log "Debian $GVISOR_SUITE's runsc package has no systrap platform"
        rm -rf "$tree"
        return 1
    fi
    mkdir -p "$RUNSC_DIR"
    install -m 0755 "$tree/x/usr/bin/runsc" "$RUNSC_DIR/.runsc.new"
    mv -f "$RUNSC_DIR/.runsc.new" "$RUNSC_DIR/runsc"
    log "installed $RUNSC_DIR/runsc from $(basename "$deb")"
    rm -rf "$tree"
}

RUNSC_PATH=""
if [ -x "$RUNSC_DIR/runsc" ] && has_systrap "$RUNSC_DIR/runsc"; then
    RUNSC_PATH="$RUNSC_DIR/runsc"
elif command -v runsc >/dev/null 2>&1 && has_systrap "$(command -v runsc)"; then
    RUNSC_PATH="$(command -v runsc)"
elif fetch_runsc; then
    RUNSC_PATH="$RUNSC_DIR/runsc"
else
    if ! command -v runsc >/dev/null 2>&1; then
        log "installing Debian package runsc"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runsc >/dev/null
    fi
    RUNSC_PATH="$(command -v runsc)"
    log "WARNING: $RUNSC_PATH has no systrap platform; under its ptrace platform a process storm" \
        "can exhaust the sandbox's pids headroom and restart the gVisor sandbox (see SECURITY.md)"
fi
# gVisor releases from 2023 on wrap the root filesystem in an overlay of their own by default
# (`--overlay2=root:self`): writes outside the volumes then live in a gVisor file store, are
# lost when the container stops and are invisible to `docker diff` and `docker commit`. A
# stopped-and-resumed sandbox must keep what was installed in it, as under runc: turn it off.
# (grep reads to the end: with -q it would leave early and the SIGPIPE would fail the pipeline.)
has_overlay2() { "$1" flags 2>&1 | grep -- '-overlay2' >/dev/null; }
if [ -z "${RUNSC_ARGS:-}" ]; then
    RUNSC_ARGS='"--network=host"'
    if has_systrap "$RUNSC_PATH"; then RUNSC_ARGS+=', "--platform=systrap"'; fi
    if has_overlay2 "$RUNSC_PATH"; then RUNSC_ARGS+=', "--overlay2=none"'; fi
    RUNSC_ARGS="[$RUNSC_ARGS]"
fi
log "runsc: $RUNSC_PATH ($("$RUNSC_PATH" --version 2>/dev/null | head -n1))"

# 2. Merge the runtime into daemon.json, keeping every other key. Writes only when it changes.
merge_python() {
    python3 - "$DAEMON_JSON" "$RUNSC_NAME" "$RUNSC_PATH" "$RUNSC_ARGS" <<'EOF'
import json, os, sys, tempfile
path, name, binary, args = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
try:
    with open(path) as f:
        text = f.read()
    cfg = json.loads(text) if text.strip() else {}
except FileNotFoundError:
    cfg = {}
if not isinstance(cfg, dict):
    sys.exit(f"{path}: top level is not a JSON object")
want = {"path": binary, "runtimeArgs": args}
if cfg.get("runtimes", {}).get(name) == want:
    print("unchanged")
    sys.exit(0)
cfg.setdefault("runtimes", {})[name] = want
os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".daemon.json.")
with os.fdopen(fd, "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
    f.flush()
    os.fsync(f.fileno())
os.chmod(tmp, 0o644)
os.replace(tmp, path)
print("changed")
EOF
}
merge_jq() {
    local cur want tmp
    cur='{}'
    [ -s "$DAEMON_JSON" ] && cur="$(cat "$DAEMON_JSON")"
    want="$(jq -cn --arg p "$RUNSC_PATH" --argjson a "$RUNSC_ARGS" '{path: $p, runtimeArgs: $a}')"
    if [ "$(jq -c --arg n "$RUNSC_NAME" '.runtimes[$n] // null' <<<"$cur")" = "$want" ]; then
        echo unchanged
        return
    fi
    mkdir -p "$(dirname "$DAEMON_JSON")"
    tmp="$(mktemp "$(dirname "$DAEMON_JSON")/.daemon.json.XXXXXX")"
    jq --arg n "$RUNSC_NAME" --argjson r "$want" '.runtimes[$n] = $r' <<<"$cur" >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$DAEMON_JSON"
    echo changed
}

if [ -f "$DAEMON_JSON" ] && [ ! -f "$DAEMON_JSON.before-runsc" ]; then
    cp -p "$DAEMON_JSON" "$DAEMON_JSON.before-runsc"
fi
if command -v python3 >/dev/null 2>&1; then
    result="$(merge_python)"
elif command -v jq >/dev/null 2>&1; then
    result="$(merge_jq)"
else
    die "need python3 or jq to edit $DAEMON_JSON"
fi
log "$DAEMON_JSON: $result"

runtime_registered() {
    if ! command -v python3 >/dev/null 2>&1; then
        docker info --format '{{json .Runtimes}}' 2>/dev/null | jq -e --arg n "$RUNSC_NAME" --arg p "$RUNSC_PATH" \
            --argjson a "$RUNSC_ARGS" '.[$n].path == $p and (.[$n].runtimeArgs // []) == $a' >/dev/null
        return
    fi
    docker info --format '{{json .Runtimes}}' 2>/dev/null |
        python3 -c 'import json,sys; r=json.load(sys.stdin).get(sys.argv[1]) or {}; sys.exit(0 if r.get("path")==sys.argv[2] and r.get("runtimeArgs")==json.loads(sys.argv[3]) else 1)' \
            "$RUNSC_NAME" "$RUNSC_PATH" "$RUNSC_ARGS"
}

# 3. Reload the daemon (runtimes are reloadable; no restart, running containers are untouched).
#    dockerd may run under systemd or, as on the build machines, directly without an init system.
if [ "$result" = changed ] || ! runtime_registered; then
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker 2>/dev/null; then
        log "reloading dockerd: systemctl reload docker"
        systemctl reload docker
    else
        pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
        if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
            pid="$(pidof dockerd || true)"
        fi
        [ -n "$pid" ] || die "dockerd is not running under systemd and its pid was not found"
        log "reloading dockerd: SIGHUP to pid $pid"
        kill -HUP "$pid"
    fi
    for _ in $(seq 1 50); do
        runtime_registered && break
        sleep 0.2
    done
    runtime_registered || die "dockerd did not pick up runtime $RUNSC_NAME (see the daemon log)"
fi

# 4. Verify.
log "docker runtimes: $(docker info --format '{{json .Runtimes}}')"
if ! docker image inspect "$TEST_IMAGE" >/dev/null 2>&1; then
    if [ "$TEST_IMAGE" = agent-sandbox-test/busybox:latest ] && [ -x "$HERE/build-test-images.sh" ]; then
        "$HERE/build-test-images.sh" >/dev/null
    else
        die "test image $TEST_IMAGE not found"
    fi
fi
out="$(docker run --rm --runtime "$RUNSC_NAME" --network none "$TEST_IMAGE" sh -c 'dmesg 2>/dev/null | head -n1; ls /sys/class/net 2>/dev/null | tr "\n" " "')" ||
    die "a container did not run with --runtime $RUNSC_NAME"
log "docker run --runtime $RUNSC_NAME: ok (${out//$'\n'/; })"
# A write to the root filesystem reaches the container's own layer and survives a stop.
probe="$(docker run -d --runtime "$RUNSC_NAME" --network none "$TEST_IMAGE" sleep 600)"
kept="$(docker exec "$probe" sh -c 'echo kept > /.runsc-probe' && docker stop -t 1 "$probe" >/dev/null &&
    docker start "$probe" >/dev/null && docker exec "$probe" cat /.runsc-probe 2>&1 || true)"
docker rm -f "$probe" >/dev/null
[ "$kept" = kept ] || die "under --runtime $RUNSC_NAME a root filesystem write did not survive a stop ($kept)"
log "docker run --runtime $RUNSC_NAME: root filesystem writes survive a stop"
