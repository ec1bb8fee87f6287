"""Copy-on-write restores against the copy path and the reference: fork and rollback of a
10 MiB / 200-file workspace and of a 1 GiB one, cold and with a warm pool, a sandbox made from a
template on the snapshot whose pool is ready, a snapshot of a fork and forks of it (a delta tree
over the first), the disk ten forks of the large snapshot use, and Docker's own create-and-start
as the floor. Standard library only (the reference runs under its own venv's Python).

    python3 bench/cow.py target/release/agent-sandbox [--n 5] [--large-mib 1024]
        [--reference target/bench-venv/bin/python]
    python3 bench/cow.py target/release/agent-sandbox --fan-out ROUNDS

Our server is started twice on a fresh data directory, with `AGENT_SANDBOX_COPY_ON_WRITE=true`
(views) and `=false` (the copy path); with `--reference`, the reference server (agent-sandbox
0.2.1, installed into that venv by bench/run.sh) is timed on the same cold forks and rollbacks.
Everything any of them made is removed at the end. `AGENT_SANDBOX_TEST_RUNTIME` picks our
runtime (default runc). The table goes to stdout. `--fan-out` also times Docker alone renaming
one running container and ten at once, the floor of a pooled Fork's claims. For a trace of a
run, `AGENT_SANDBOX_LOG` (a log filter) is passed to our server and `BENCH_KEEP_LOG=FILE` keeps
its log (`FILE.views` and `FILE.copy`, one per server).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import pathlib
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

API = "/apis/agent-sandbox.io/v1"
IMAGE = "agent-sandbox-test/busybox:latest"
SMALL = (
    "dd if=/dev/urandom of=/workspace/data.bin bs=1048576 count=10 2>/dev/null"
    " && mkdir -p /workspace/small"
    " && i=0 && while [ $i -lt 200 ]; do echo \"file $i\" > /workspace/small/f$i.txt; i=$((i+1)); done"
)


def large(mib: int) -> str:
    files = max(1, mib // 16)
    return (
        SMALL
        + f" && i=0 && while [ $i -lt {files} ]; do"
        " dd if=/dev/urandom of=/workspace/big$i bs=1048576 count=16 2>/dev/null; i=$((i+1)); done"
    )


class Server:
    """A server of the `/v1` API started on a free port with a fresh data directory."""

    def __init__(self, command: list, extra_env: dict):
        self.cow = False
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="cow-bench-"))
        self.data = self.tmp / "data"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.key = "bench-" + os.urandom(16).hex()
        env = {
            "PATH": os.environ.get("PATH", ""),
            "AGENT_SANDBOX_HOST": "127.0.0.1",
            "AGENT_SANDBOX_PORT": str(self.port),
            "AGENT_SANDBOX_DATA_DIR": str(self.data),
            "AGENT_SANDBOX_API_KEYS": self.key,
            "AGENT_SANDBOX_DEFAULT_IMAGE": IMAGE,
            "AGENT_SANDBOX_ALLOWED_IMAGES": "agent-sandbox-test/*",
            "AGENT_SANDBOX_MAX_SANDBOXES": "100",
            "AGENT_SANDBOX_MAX_SNAPSHOT_BYTES": str(4 << 30),
            **extra_env,
        }
        if os.environ.get("AGENT_SANDBOX_LOG"):
            env["AGENT_SANDBOX_LOG"] = os.environ["AGENT_SANDBOX_LOG"]  # a trace of the run, kept with BENCH_KEEP_LOG
        self.log = open(self.tmp / "server.log", "wb")
        self.proc = subprocess.Popen(command, env=env, stdout=self.log, stderr=self.log)
        deadline = time.time() + 120
        while True:
            try:
                self.call("GET", "/v1/sandboxes")
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"the server did not start: see {self.tmp}/server.log")
                time.sleep(0.2)

    def call(self, method: str, path: str, body=None, expect=(200, 201, 202, 204)):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        text = response.read()
        conn.close()
        if response.status not in expect:
            raise RuntimeError(f"{method} {path}: {response.status} {text[:300]!r}")
        return json.loads(text) if text else None

    def timed(self, method: str, path: str, body=None, expect=(200, 201, 202, 204)):
        start = time.perf_counter()
        answer = self.call(method, path, body, expect)
        return (time.perf_counter() - start) * 1000.0, answer

    def exec(self, sandbox: str, command: str) -> None:
        result = self.call(
            "POST", f"/v1/sandboxes/{sandbox}/exec", {"command": command, "timeout_seconds": 600}
        )
        if result.get("exit_code") != 0:
            raise RuntimeError(f"{command}: {result}")



class Ours(Server):
    def __init__(self, binary: str, cow: bool, runtime: str):
        super().__init__([binary, "serve"], {
            "AGENT_SANDBOX_DOCKER_RUNTIME": runtime,
            "AGENT_SANDBOX_COPY_ON_WRITE": "true" if cow else "false",
            "AGENT_SANDBOX_LOG": "warn",
        })
        self.cow = cow
        self.server_id = (self.data / "server-id").read_text().strip()

    def pool(self, name: str, size: int) -> None:
        doc = {
            "apiVersion": "agent-sandbox.io/v1",
            "kind": "SandboxPool",
            "metadata": {"name": name},
            "spec": {"image": IMAGE, "size": size, "readOnlyRootfs": True},
        }
        self.call("POST", f"{API}/sandboxpools", doc)
        self.wait_pool(name, size)

    def wait_pool(self, name: str, size: int) -> None:
        deadline = time.time() + 600
        while time.time() < deadline:
            pool = self.call("GET", f"{API}/sandboxpools/{name}")
            if ((pool or {}).get("status") or {}).get("readyReplicas", 0) >= size:
                return
            time.sleep(0.25)
        raise RuntimeError(f"pool {name} did not fill")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        label = f"label=io.agent-sandbox.server={self.server_id}"
        for kind in (["ps", "-aq"], ["volume", "ls", "-q"]):
            ids = subprocess.run(["docker", *kind, "--filter", label], capture_output=True, text=True)
            for obj in ids.stdout.split():
                rm = ["rm", "-f"] if kind[0] == "ps" else ["volume", "rm", "-f"]
                subprocess.run(["docker", *rm, obj], capture_output=True)
        if os.environ.get("BENCH_KEEP_LOG"):
            kept = os.environ["BENCH_KEEP_LOG"] + (".views" if self.cow else ".copy")
            shutil.copy(self.tmp / "server.log", kept)
        shutil.rmtree(self.tmp, ignore_errors=True)


class Reference(Server):
    """The reference server (agent-sandbox 0.2.1 through bench/reference_server.py) under the
    Python of `python` (bench/run.sh's venv), on the daemon's default runtime."""

    def __init__(self, python: str):
        script = pathlib.Path(__file__).with_name("reference_server.py")
        super().__init__([python, str(script), "serve"], {})

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        # Its sandboxes, by its naming scheme, as its records and log name them.
        ids = {p.stem for p in (self.data / "sandboxes").glob("*.json")}
        ids |= set(re.findall(r"sb_[0-9a-f]{16}", (self.tmp / "server.log").read_text(errors="replace")))
        for sid in ids:
            subprocess.run(["docker", "rm", "-f", "-v", f"agent-sandbox-{sid}"], capture_output=True)
            subprocess.run(["docker", "volume", "rm", "-f", f"agent-sandbox-{sid}-workspace"],
                           capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


def du(path: pathlib.Path) -> int:
    out = subprocess.run(["du", "-sxb", str(path)], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out else 0


def trees(ours: Ours) -> int:
    path = ours.data / "trees"
    return sum(1 for p in path.iterdir() if not p.name.startswith(".")) if path.is_dir() else 0


def wait_tree(ours: Ours, before: int) -> None:
    """Waits until the snapshot's tree, unpacked in the background after it was taken, is there
    (untimed: it is part of taking the snapshot, not of the restores measured)."""
    deadline = time.time() + 300
    while time.time() < deadline:
        if trees(ours) > before:
            return
        time.sleep(0.1)


def restores(ours: Server, sandbox: str, snap: str, n: int, results: dict, tag: str,
             refilled=None, claimed=None) -> None:
    """N forks, then N rollbacks of `sandbox`, each timed; with `refilled`, called (untimed)
    between the two, the rollbacks start once the pool has made up for the forks' claims; with
    `claimed`, each restored sandbox's `status.claimedFrom` must be that (checked untimed)."""
    def check(name: str) -> None:
        if claimed is not None:
            got = ((ours.call("GET", f"{API}/sandboxes/{name}") or {}).get("status") or {})
            if got.get("claimedFrom") != claimed:
                raise RuntimeError(f"{name} claimed from {got.get('claimedFrom')!r}, not {claimed!r}")
    forks = []
    for _ in range(n):
        ms, sb = ours.timed("POST", f"/v1/snapshots/{snap}/fork", {}, expect=(201,))
        results.setdefault(f"fork{tag}", []).append(ms)
        forks.append(sb["id"])
        check(sb["id"])
    if refilled:
        refilled()
    for _ in range(n):
        ms, _ = ours.timed("POST", f"/v1/sandboxes/{sandbox}/rollback", {"snapshot_id": snap}, (200,))
        results.setdefault(f"rollback{tag}", []).append(ms)
        check(sandbox)
    for f in forks:
        ours.call("DELETE", f"/v1/sandboxes/{f}")


def template_claims(ours: Ours, sandbox: str, snap: str, n: int, results: dict) -> None:
    """Sandboxes made from a `SandboxTemplate` on the snapshot whose pool holds n+1 members (made
    first, untimed): from the create request until the sandbox's status says Running (polled
    every 2 ms), through the resource API. Then, the pool full again, N forks of the snapshot
    and N rollbacks of `sandbox` to it, which take the template's members too."""
    template = f"cow-bench-t-{os.urandom(3).hex()}"
    doc = {
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "SandboxTemplate",
        "metadata": {"name": template},
        "spec": {"snapshot": snap, "readOnlyRootfs": True, "pool": {"size": n + 1}},
    }
    ours.call("POST", f"{API}/sandboxtemplates", doc)
    prefix = f"agent-sandbox-pool.T-{template}."

    def filled() -> None:
        deadline = time.time() + 600
        while True:
            names = subprocess.run(["docker", "ps", "--format", "{{.Names}}"],
                                   capture_output=True, text=True)
            if sum(1 for line in names.stdout.split() if line.startswith(prefix)) >= n + 1:
                break
            if time.time() > deadline:
                raise RuntimeError(f"template {template}'s pool did not fill")
            time.sleep(0.25)
        time.sleep(2)  # let the members' connections open (they are warmed in the background)

    filled()
    made = []
    for i in range(n):
        name = f"{template}-{i}"
        body = {"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                "metadata": {"name": name}, "spec": {"template": template}}
        start = time.perf_counter()
        ours.call("POST", f"{API}/sandboxes", body, (201,))
        while True:
            got = ours.call("GET", f"{API}/sandboxes/{name}")
            if ((got or {}).get("status") or {}).get("phase") == "Running":
                break
            time.sleep(0.002)
        results.setdefault("sandbox from a pooled template", []).append((time.perf_counter() - start) * 1000.0)
        if (got.get("status") or {}).get("claimedFrom") != f"T-{template}":
            raise RuntimeError(f"{name} was not claimed from the template's pool: {got}")
        made.append(name)
    for name in made:
        ours.call("DELETE", f"{API}/sandboxes/{name}")
    filled()
    restores(ours, sandbox, snap, n, results, " (template pool)", filled, f"T-{template}")
    ours.call("DELETE", f"{API}/sandboxtemplates/{template}")


def fan_out(ours: Ours, snap: str, rounds: int, results: dict) -> None:
    """A `Fork` resource of 10 replicas against one of 1, alternating, each timed from its
    create until `status.readyReplicas` reaches its replicas (polled every 5 ms): cold, then
    with a template pool of 11 on the snapshot, full before each Fork (every child checked,
    untimed, to have claimed from it)."""
    def one(replicas: int, tag: str, claimed) -> None:
        name = f"cow-fan-{os.urandom(3).hex()}"
        doc = {"apiVersion": "agent-sandbox.io/v1", "kind": "Fork", "metadata": {"name": name},
               "spec": {"snapshot": snap, "replicas": replicas}}
        start = time.perf_counter()
        ours.call("POST", f"{API}/forks", doc)
        while True:
            status = ((ours.call("GET", f"{API}/forks/{name}") or {}).get("status") or {})
            if status.get("readyReplicas", 0) >= replicas:
                break
            time.sleep(0.005)
        results.setdefault(f"Fork of {replicas}{tag}", []).append((time.perf_counter() - start) * 1000.0)
        if claimed:
            for i in range(replicas):
                got = ((ours.call("GET", f"{API}/sandboxes/{name}-{i}") or {}).get("status") or {})
                if got.get("claimedFrom") != claimed:
                    raise RuntimeError(f"{name}-{i} claimed from {got.get('claimedFrom')!r}")
        ours.call("DELETE", f"{API}/forks/{name}")
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                ours.call("GET", f"{API}/forks/{name}", expect=(200,))
            except RuntimeError:
                break  # gone: 404
            time.sleep(0.1)

    for i in range(rounds):
        for replicas in (1, 10) if i % 2 == 0 else (10, 1):
            one(replicas, " (cold)", None)
    template = f"cow-fan-t-{os.urandom(3).hex()}"
    doc = {"apiVersion": "agent-sandbox.io/v1", "kind": "SandboxTemplate",
           "metadata": {"name": template},
           "spec": {"snapshot": snap, "readOnlyRootfs": True, "pool": {"size": 11}}}
    ours.call("POST", f"{API}/sandboxtemplates", doc)
    prefix = f"agent-sandbox-pool.T-{template}."

    def filled() -> None:
        deadline = time.time() + 600
        while time.time() < deadline:
            names = subprocess.run(["docker", "ps", "--format", "{{.Names}}"],
                                   capture_output=True, text=True).stdout.split()
            if sum(1 for line in names if line.startswith(prefix)) >= 11:
                time.sleep(2)
                return
            time.sleep(0.25)
        raise RuntimeError(f"template {template}'s pool did not fill")

    for i in range(rounds):
        for replicas in (1, 10) if i % 2 == 0 else (10, 1):
            filled()
            one(replicas, " (template pool)", f"T-{template}")
    ours.call("DELETE", f"{API}/sandboxtemplates/{template}")


def chained(ours: Ours, snap: str, n: int, results: dict) -> int:
    """A fork of `snap` writes 1 MiB and is snapshotted ("snapshot of a fork", timed to its
    answer); then N forks of that snapshot, each timed ("fork of the fork's snapshot": with views,
    its tree is a delta stacked on `snap`'s). Returns the bytes the new snapshot's tree holds (0
    on the copy path, which makes none)."""
    child = ours.call("POST", f"/v1/snapshots/{snap}/fork", {}, (201,))["id"]
    ours.exec(child, "dd if=/dev/urandom of=/workspace/mine bs=1048576 count=1 2>/dev/null; sync")
    path = ours.data / "trees"
    known = {p.name for p in path.iterdir()} if path.is_dir() else set()
    ms, taken = ours.timed("POST", f"/v1/sandboxes/{child}/snapshots", {"name": None})
    results.setdefault("snapshot of a fork (1 MiB written)", []).append(ms)
    second = taken["id"]
    tree_bytes = 0
    if ours.cow:
        deadline = time.time() + 300
        while time.time() < deadline:
            new = [p for p in path.iterdir() if p.name not in known and p.is_dir()
                   and not p.name.startswith(".")]
            if new:
                tree_bytes = du(new[0])
                break
            time.sleep(0.1)
    os.sync()
    forks = []
    for _ in range(n):
        ms, sb = ours.timed("POST", f"/v1/snapshots/{second}/fork", {}, expect=(201,))
        results.setdefault("fork of the fork's snapshot", []).append(ms)
        forks.append(sb["id"])
    for f in forks + [child]:
        ours.call("DELETE", f"/v1/sandboxes/{f}")
    ours.call("DELETE", f"/v1/snapshots/{second}")
    return tree_bytes


def ten_forks_disk(ours: Ours, snap: str) -> int:
    """Bytes the data directory's trees and views and the forks' volumes hold after ten forks of
    `snap` each wrote 1 MiB (the snapshot's own tar is not counted)."""
    forks = [ours.call("POST", f"/v1/snapshots/{snap}/fork", {}, (201,))["id"] for _ in range(10)]
    for f in forks:
        ours.exec(f, "dd if=/dev/urandom of=/workspace/mine bs=1048576 count=1 2>/dev/null; sync")
    used = du(ours.data / "trees") + du(ours.data / "views")
    label = f"label=io.agent-sandbox.server={ours.server_id}"
    vols = subprocess.run(["docker", "volume", "ls", "-q", "--filter", label], capture_output=True, text=True)
    for v in vols.stdout.split():
        info = json.loads(subprocess.run(["docker", "volume", "inspect", v], capture_output=True, text=True).stdout)[0]
        if (info.get("Options") or {}).get("type") != "overlay" and (info.get("Labels") or {}).get("io.agent-sandbox.id") in forks:
            used += du(pathlib.Path(info["Mountpoint"]))
    for f in forks:
        ours.call("DELETE", f"/v1/sandboxes/{f}")
    return used


def docker_floor(n: int, runtime: str) -> list:
    """Docker alone: create and start of a container of the bench image with a fresh named volume
    at /workspace (through the CLI, whose own start-up is included)."""
    samples = []
    for i in range(n):
        name = f"cow-bench-floor-{os.getpid()}-{i}"
        start = time.perf_counter()
        subprocess.run(
            ["docker", "run", "-d", "--name", name, "--runtime", runtime, "--network", "none",
             "--read-only", "-v", f"{name}:/workspace", IMAGE, "sleep", "3600"],
            check=True, capture_output=True,
        )
        samples.append((time.perf_counter() - start) * 1000.0)
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        subprocess.run(["docker", "volume", "rm", "-f", name], capture_output=True)
    return samples


class _DockerSocket(http.client.HTTPConnection):
    """The Engine API on the local socket (the CLI would add its own start-up to each call)."""

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect("/var/run/docker.sock")


def docker_renames(rounds: int, runtime: str, results: dict) -> None:
    """Docker alone: what a pooled fork's claims cost the daemon. A claim renames a running pool
    member to the child's container name; here one rename, and ten at once (one thread each, as
    the server's workers claim), of running containers of the bench image, alternating, ROUNDS
    each, timed until the last rename has answered."""
    names = [f"cow-bench-rename-{os.getpid()}-{i}" for i in range(10)]
    for name in names:
        subprocess.run(["docker", "run", "-d", "--name", name, "--runtime", runtime,
                        "--network", "none", IMAGE, "sleep", "3600"],
                       check=True, capture_output=True)

    def rename(old: str, new: str) -> None:
        conn = _DockerSocket("localhost", timeout=60)
        conn.request("POST", f"/containers/{old}/rename?name={new}")
        answer = conn.getresponse()
        answer.read()
        conn.close()
        if answer.status != 204:
            raise RuntimeError(f"rename {old} -> {new}: {answer.status}")

    def timed(batch: list, tag: str) -> None:
        failed: list = []

        def one(name: str) -> None:
            try:
                rename(name, name + "-x")
            except Exception as error:  # a thread's exception would only be printed
                failed.append(error)

        threads = [threading.Thread(target=one, args=(n,)) for n in batch]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = (time.perf_counter() - start) * 1000.0
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(batch)} renames failed: {failed[0]}")
        results.setdefault(tag, []).append(elapsed)
        for n in batch:
            rename(n + "-x", n)

    try:
        for i in range(rounds):
            for size in (1, 10) if i % 2 == 0 else (10, 1):
                timed(names[:size], f"Docker alone: {size} rename{'s at once' if size > 1 else ''}")
    finally:
        for name in names:
            subprocess.run(["docker", "rm", "-f", name, name + "-x"], capture_output=True)


def main() -> int:
    args = argparse.ArgumentParser()
    args.add_argument("binary")
    args.add_argument("--n", type=int, default=5)
    args.add_argument("--large-mib", type=int, default=1024)
    args.add_argument("--fan-out", type=int, metavar="ROUNDS",
                      help="only time Forks of 10 replicas against 1 (views, 10 MiB), ROUNDS each")
    args.add_argument("--reference", metavar="PYTHON",
                      help="also time the reference server's fork and rollback under this Python "
                           "(target/bench-venv/bin/python, which bench/run.sh makes)")
    a = args.parse_args()
    runtime = os.environ.get("AGENT_SANDBOX_TEST_RUNTIME", "runc")
    if a.fan_out:
        ours = Ours(a.binary, True, runtime)
        try:
            sb = ours.call("POST", "/v1/sandboxes", {})["id"]
            ours.exec(sb, SMALL)
            before = trees(ours)
            snap = ours.call("POST", f"/v1/sandboxes/{sb}/snapshots", {"name": None})["id"]
            wait_tree(ours, before)
            os.sync()
            results: dict = {}
            fan_out(ours, snap, a.fan_out, results)
            docker_renames(a.fan_out, runtime, results)
        finally:
            ours.stop()
        print(f"\nruntime {runtime}, views, 10 MiB, {a.fan_out} rounds, ms\n")
        print("| Fork | median | min | max |\n|---|---|---|---|")
        for op, samples in results.items():
            print(f"| {op} | {statistics.median(samples):.0f} | {min(samples):.0f} | {max(samples):.0f} |")
        return 0
    table = {}
    disk = {}
    delta = {}
    for mode, cow in (("views", True), ("copy", False)):
        ours = Ours(a.binary, cow, runtime)
        try:
            for size, fill in (("10 MiB", SMALL), (f"{a.large_mib} MiB", large(a.large_mib))):
                results: dict = {}
                sb = ours.call("POST", "/v1/sandboxes", {})["id"]
                ours.exec(sb, fill)
                before = trees(ours)
                snap = ours.call("POST", f"/v1/sandboxes/{sb}/snapshots", {"name": None})["id"]
                if cow:
                    wait_tree(ours, before)
                # The setup wrote the workspace, its tar and its tree: flush them (untimed) so the
                # restores measured do not share the disk with their writeback.
                os.sync()
                restores(ours, sb, snap, a.n, results, "")
                pool = f"cow-bench-{mode}-{size.split()[0]}"
                ours.pool(pool, a.n + 1)
                restores(ours, sb, snap, a.n, results, " (warm pool)",
                         lambda: (ours.wait_pool(pool, a.n + 1), time.sleep(2)))
                ours.call("DELETE", f"{API}/sandboxpools/{pool}")
                template_claims(ours, sb, snap, a.n, results)
                tree_bytes = chained(ours, snap, a.n, results)
                if cow:
                    delta[size] = tree_bytes
                if size != "10 MiB":
                    disk[mode] = ten_forks_disk(ours, snap)
                for op, samples in results.items():
                    table[(op, size, mode)] = statistics.median(samples)
                ours.call("DELETE", f"/v1/sandboxes/{sb}")
                print(f"# {mode} {size} done", flush=True)
        finally:
            ours.stop()
    if a.reference:
        ref = Reference(a.reference)
        try:
            for size, fill in (("10 MiB", SMALL), (f"{a.large_mib} MiB", large(a.large_mib))):
                results = {}
                sb = ref.call("POST", "/v1/sandboxes", {})["id"]
                ref.exec(sb, fill)
                snap = ref.call("POST", f"/v1/sandboxes/{sb}/snapshots", {"name": None})["id"]
                os.sync()
                restores(ref, sb, snap, a.n, results, "")
                for op, samples in results.items():
                    table[(op, size, "reference")] = statistics.median(samples)
                ref.call("DELETE", f"/v1/sandboxes/{sb}")
                print(f"# reference {size} done", flush=True)
        finally:
            ref.stop()
    floor = statistics.median(docker_floor(a.n, runtime))
    print(f"\nruntime {runtime}, N = {a.n}, medians in ms\n")
    print("| operation | workspace | views | copy path | reference | views / reference |")
    print("|---|---|---|---|---|---|")
    for op in ("fork", "rollback", "fork (warm pool)", "rollback (warm pool)",
               "sandbox from a pooled template", "fork (template pool)",
               "rollback (template pool)", "snapshot of a fork (1 MiB written)",
               "fork of the fork's snapshot"):
        for size in ("10 MiB", f"{a.large_mib} MiB"):
            v, c = table.get((op, size, "views")), table.get((op, size, "copy"))
            r = table.get((op, size, "reference"))
            ref_cells = f"{r:.0f} | {v / r:.3f}" if r and v else "– | –"
            print(f"| {op} | {size} | {v:.0f} | {c:.0f} | {ref_cells} |")
    print(f"| Docker alone: create and start (CLI) | empty | {floor:.0f} | | | |")
    for size, used in delta.items():
        print(f"\ntree of the snapshot of a fork of the {size} snapshot, 1 MiB written: "
              f"{used / (1 << 20):.2f} MiB")
    for mode, used in disk.items():
        print(f"\ndisk of ten forks of the {a.large_mib} MiB snapshot, 1 MiB written each, {mode}: "
              f"{used / (1 << 30):.2f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
