#!/usr/bin/env bash
# Build the offline test images used by agent-sandbox's integration tests.
#
#   agent-sandbox-test/busybox:latest   always (a few seconds)
#   agent-sandbox-test/python:latest    only with --python (debootstrap; about a minute)
#
# No image registry is needed: root filesystems come from Debian packages and are
# loaded with `docker import`. Images that already exist are kept unless --force.
#
# Known quirks of Debian bookworm's busybox-static 1.35 (the busybox image): `wget` segfaults
# on start (use `nc` with an IP for network checks), `nslookup` works, there is no `nohup`.
#
# Usage: scripts/build-test-images.sh [--force] [--python] [--help]
set -euo pipefail

BUSYBOX_IMAGE="agent-sandbox-test/busybox:latest"
PYTHON_IMAGE="agent-sandbox-test/python:latest"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PATH_ENV="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

force=0
python=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        --python) python=1 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

log() { printf '[build-test-images] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "cannot reach the Docker daemon"
[ "$(id -u)" = 0 ] || die "must run as root (files in the image must be owned by root, and apt/debootstrap need it)"

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

apt_updated=0
apt_install() {
    # apt_install PKG...: install Debian packages that are missing.
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    if [ "$apt_updated" = 0 ]; then
        apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

WORK="$(mktemp -d /tmp/agent-sandbox-images.XXXXXX)"
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

# passwd/group shared by both images: root, and the sandbox user 1000:1000 with HOME=/workspace.
# write_accounts ROOTFS SHELL [ROOT_PASSWORD_FIELD]
write_accounts() {
    local root="$1" shell="$2" rootpw="${3-x}"
    mkdir -p "$root/etc"
    cat >"$root/etc/passwd" <<EOF
root:$rootpw:0:0:root:/root:$shell
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
sandbox:x:1000:1000:sandbox:/workspace:$shell
EOF
    cat >"$root/etc/group" <<EOF
root:x:0:
nogroup:x:65534:
sandbox:x:1000:
EOF
    chmod 0644 "$root/etc/passwd" "$root/etc/group"
}

# Tar the root filesystem with every file owned by root (numeric ids) and import it.
# A replaced image is removed (if no container uses it) so --force leaves no dangling images.
import_rootfs() {
    local root="$1" image="$2" cmd="$3" old new
    old="$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)"
    tar -C "$root" --numeric-owner --owner=0 --group=0 -cf - . |
        docker import \
            -c "ENV $PATH_ENV" \
            -c "CMD [\"$cmd\"]" \
            -c "LABEL io.agent-sandbox.test-image=true" \
            -m "agent-sandbox test image built by scripts/build-test-images.sh" \
            - "$image" >/dev/null
    new="$(docker image inspect --format '{{.Id}}' "$image")"
    if [ -n "$old" ] && [ "$old" != "$new" ]; then
        docker image rm "$old" >/dev/null 2>&1 || log "kept old image $old (still in use)"
    fi
}

# Quick smoke tests of what the tests rely on (run after a build only, so a no-op run stays fast),
# including that the setuid copy really gains root when nothing stops it: a test that sees it
# fail under hardening then means something.
smoke_busybox() {
    docker run --rm --network none "$BUSYBOX_IMAGE" sh -c \
        'test "$(stat -c %u:%g:%a /usr/local/bin/suid-busybox)" = 0:0:4755 && grep -q "^sandbox:x:1000:1000:" /etc/passwd' ||
        die "$BUSYBOX_IMAGE smoke test failed"
    local euid denied
    euid="$(docker run --rm --network none --user 1000:1000 "$BUSYBOX_IMAGE" \
        sh -c 'exec -a su /usr/local/bin/suid-busybox -c "id -u"' 2>&1 || true)"
    [ "$euid" = 0 ] || die "setuid copy did not gain root without hardening (got: $euid)"
    denied="$(docker run --rm --network none --user 1000:1000 --security-opt no-new-privileges "$BUSYBOX_IMAGE" \
        sh -c 'exec -a su /usr/local/bin/suid-busybox -c "id -u"' 2>&1 || true)"
    [ "$denied" != 0 ] || die "setuid copy gained root despite no-new-privileges"
}
smoke_python() {
    docker run --rm --network none --user 1000:1000 "$PYTHON_IMAGE" python3 -c 'print("ok")' >/dev/null ||
        die "$PYTHON_IMAGE smoke test failed"
}

build_busybox() {
    if image_exists "$BUSYBOX_IMAGE" && [ "$force" = 0 ]; then
        log "$BUSYBOX_IMAGE exists (use --force to rebuild)"
        return 0
    fi
    local start=$SECONDS
    log "building $BUSYBOX_IMAGE from Debian busybox-static"
    command -v dpkg-deb >/dev/null || die "dpkg-deb not found (this script expects a Debian host)"
    (
        cd "$WORK"
        if ! apt-get download busybox-static >/dev/null 2>&1; then
            apt-get update -qq
            apt-get download busybox-static >/dev/null
        fi
    )
    local deb
    deb="$(find "$WORK" -maxdepth 1 -name 'busybox-static_*.deb' | head -n1)"
    [ -n "$deb" ] || die "apt-get download busybox-static produced no .deb"
    mkdir -p "$WORK/pkg"
    dpkg-deb -x "$deb" "$WORK/pkg"
    [ -x "$WORK/pkg/bin/busybox" ] || die "busybox binary not found in $deb"

    local R="$WORK/busybox-rootfs"
    mkdir -p "$R"/{bin,sbin,etc,dev,proc,sys,root,usr/bin,usr/sbin,usr/local/bin,workspace}
    install -m 0755 "$WORK/pkg/bin/busybox" "$R/bin/busybox"
    # /tmp is sticky and world-writable like on any Linux system (the sandbox mounts a tmpfs over it).
    install -d -m 1777 "$R/tmp"
    # /workspace is root-owned 0755 on purpose, like a path that a real image lacks or does not
    # prepare for uid 1000. Note: Docker copies an image directory's content and ownership into an
    # empty named volume mounted over it, at `docker create` (unless the mount sets NoCopy).
    chmod 0755 "$R/workspace"
    chmod 0700 "$R/root"

    # One symlink per applet, all in /bin (busybox --list prints bare names).
    local applet n=0
    while IFS= read -r applet; do
        if [ -z "$applet" ] || [ "$applet" = busybox ]; then continue; fi
        ln -sf busybox "$R/bin/$applet"
        n=$((n + 1))
    done < <("$R/bin/busybox" --list)
    [ -e "$R/bin/sh" ] || die "busybox --list did not include sh"
    ln -sf /bin/env "$R/usr/bin/env"   # for '#!/usr/bin/env sh' scripts

    # A setuid-root copy: tests use it to show that no-new-privileges keeps it unprivileged.
    # Debian's busybox has FEATURE_SUID: run setuid, it drops root by itself for almost every
    # applet, which would make such a test pass for the wrong reason. `su` is one that needs and
    # keeps root, and root has an empty password in this image (below), so
    #   exec -a su /usr/local/bin/suid-busybox -c 'id -u'
    # run as uid 1000 prints 0 where setuid works (plain `docker run --user 1000`) and fails with
    # "su: must be suid to work properly" under no-new-privileges. (An /etc/busybox.conf [SUID]
    # rule would also do, but it makes this busybox segfault whenever a non-root user's shell
    # runs an applet that fails, e.g. `sh -c 'touch /etc/x'` exits 139 instead of 1.)
    install -m 4755 -o 0 -g 0 "$WORK/pkg/bin/busybox" "$R/usr/local/bin/suid-busybox"

    write_accounts "$R" /bin/sh ""   # empty root password: see suid-busybox above
    echo sandbox >"$R/etc/hostname"
    chown -R 0:0 "$R"
    chmod 4755 "$R/usr/local/bin/suid-busybox"   # chown clears setuid; set it last

    import_rootfs "$R" "$BUSYBOX_IMAGE" /bin/sh
    smoke_busybox
    log "built $BUSYBOX_IMAGE ($n applets) in $((SECONDS - start))s"
}

build_python() {
    if image_exists "$PYTHON_IMAGE" && [ "$force" = 0 ]; then
        log "$PYTHON_IMAGE exists (use --force to rebuild)"
        return 0
    fi
    local start=$SECONDS
    log "building $PYTHON_IMAGE: debootstrap --variant=minbase $SUITE + python3 (about a minute)"
    command -v debootstrap >/dev/null || apt_install debootstrap
    local R="$WORK/python-rootfs"
    debootstrap --variant=minbase --include=python3 "$SUITE" "$R" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
        { tail -n 30 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }

    # Trim what a container does not need; keep dpkg's database intact.
    rm -rf "$R"/var/cache/apt/archives/*.deb "$R"/var/lib/apt/lists/* "$R"/usr/share/doc/* \
        "$R"/usr/share/man/* "$R"/usr/share/info/* "$R"/usr/share/locale/*
    # The sandbox user, added the normal way so the shadow files stay consistent.
    if ! chroot "$R" getent passwd sandbox >/dev/null 2>&1; then
        chroot "$R" groupadd -g 1000 sandbox
        chroot "$R" useradd -u 1000 -g 1000 -d /workspace -M -s /bin/sh sandbox
    fi
    install -d -m 0755 "$R/workspace"
    install -d -m 1777 "$R/tmp"
    echo sandbox >"$R/etc/hostname"
    # Device nodes and mounts are provided by the container runtime.
    rm -rf "${R:?}"/dev/* "${R:?}"/proc/* "${R:?}"/sys/*

    import_rootfs "$R" "$PYTHON_IMAGE" /bin/sh
    smoke_python
    log "built $PYTHON_IMAGE in $((SECONDS - start))s"
}

build_busybox
if [ "$python" = 1 ]; then
    build_python
fi

docker image ls --filter "reference=agent-sandbox-test/*"
