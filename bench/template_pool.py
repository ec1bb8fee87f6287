"""A sandbox from a template pool (a SandboxTemplate with `snapshot` set to a Full snapshot and
`pool: {size}`) against a pooled `/v1` fork of a Workspace snapshot of the same size, same
server, same run. Standard library only.

    python3 bench/template_pool.py target/debug/agent-sandbox [--n 10] [--rootfs-mib 100]

One server on a fresh data directory (`AGENT_SANDBOX_DOCKER_RUNTIME` from the environment picks
the runtime, default runc). The issue's case: a source Sandbox with `readOnlyRootfs: false` gets
the 10 MiB / 200-file workspace of cow.py's SMALL and, as root, 100 MiB of random data in
/usr/local/share/bench (root filesystem changes; `--rootfs-mib` sets the size); its Full snapshot
(a `Snapshot` resource, waited Ready) holds both. A second Sandbox of the same shape gets SMALL
plus a workspace file of the same 100 MiB, so that its Workspace snapshot
(`POST /v1/sandboxes/{id}/snapshots`) is of the same size as the Full one.

- context, first: N plain `/v1` forks of the Workspace snapshot, no pool, each timed until it
  answers;
- then a SandboxPool of N+1 matching the forks (same image, `readOnlyRootfs: false`, as the
  source) and a SandboxTemplate `{snapshot: <Full>, readOnlyRootfs: false, pool: {size: N+1}}`;
  once both have N+1 running members, N rounds, alternating which goes first:
  - pooled fork: `POST /v1/snapshots/{snap}/fork`, timed until it answers (it answers once the
    child runs);
  - template pool: `POST /apis/agent-sandbox.io/v1/sandboxes` with `spec.template`, timed from
    the POST until a `GET` of the sandbox shows phase Running (polled every 2 ms; each GET's own
    time is part of the figure, nothing is subtracted).
  Between rounds both pools are let refill (untimed). Each child's `status.claimedFrom` is
  checked (the pool's name, `T-<template>` for the template's), and each template child is
  checked, by one untimed exec, to hold the root filesystem file and a workspace file.

Everything the server made (containers, volumes, the Full snapshot's image) is removed by its
server label at the end. Table to stdout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cow import API, IMAGE, SMALL, Ours  # noqa: E402

def rootfs(mib: int) -> str:
    return ("mkdir -p /usr/local/share/bench"
            f" && dd if=/dev/urandom of=/usr/local/share/bench/blob bs=1048576 count={mib} 2>/dev/null")


def workspace_extra(mib: int) -> str:
    return f"dd if=/dev/urandom of=/workspace/extra.bin bs=1048576 count={mib} 2>/dev/null"


def p95(samples: list) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered) + 0.5) - 1))]


def resource(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "agent-sandbox.io/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def wait_phase(ours: Ours, plural: str, name: str, phase: str, every: float, limit: float = 600.0) -> int:
    """Polls until the resource shows `phase`; answers how many GETs that took."""
    deadline = time.time() + limit
    gets = 0
    while time.time() < deadline:
        doc = ours.call("GET", f"{API}/{plural}/{name}", expect=(200, 404)) or {}
        gets += 1
        if (doc.get("status") or {}).get("phase") == phase:
            return gets
        time.sleep(every)
    raise RuntimeError(f"{plural}/{name} not {phase} after {limit} s")


def members(prefix: str) -> int:
    """Running warm members whose container name starts with `agent-sandbox-pool.<prefix>.`
    (a claimed member is renamed to its sandbox's container name)."""
    out = subprocess.run(
        ["docker", "ps", "--format", "{{.Names}}", "--filter", "label=io.agent-sandbox.managed=true"],
        capture_output=True, text=True,
    ).stdout
    return sum(1 for n in out.split() if n.startswith(f"agent-sandbox-pool.{prefix}."))


def wait_members(wanted: dict, limit: float = 300.0) -> float:
    start = time.time()
    while time.time() - start < limit:
        if all(members(p) >= n for p, n in wanted.items()):
            return time.time() - start
        time.sleep(0.25)
    raise RuntimeError(f"pools not refilled after {limit} s: " + ", ".join(f"{p}={members(p)}" for p in wanted))


def claimed_from(ours: Ours, name: str):
    doc = ours.call("GET", f"{API}/sandboxes/{name}", expect=(200, 404)) or {}
    return (doc.get("status") or {}).get("claimedFrom")


def main() -> int:
    args = argparse.ArgumentParser()
    args.add_argument("binary")
    args.add_argument("--n", type=int, default=10)
    args.add_argument("--rootfs-mib", type=int, default=100)
    a = args.parse_args()
    n = a.n
    runtime = os.environ.get("AGENT_SANDBOX_DOCKER_RUNTIME", "runc")
    tag = f"{os.getpid() % 100000}"
    results: dict = {"unpooled": [], "pooled": [], "template": [], "template POST alone": [],
                     "GETs until Running": []}
    odd: list = []
    ours = Ours(a.binary, True, runtime)
    try:
        source = f"tpb-src-{tag}"
        ours.call("POST", f"{API}/sandboxes", resource("Sandbox", source, {"image": IMAGE, "readOnlyRootfs": False}))
        wait_phase(ours, "sandboxes", source, "Running", 0.1)
        ours.exec(source, SMALL)
        subprocess.run(["docker", "exec", "-u", "0", f"agent-sandbox-{source}", "sh", "-c", rootfs(a.rootfs_mib)],
                       check=True, capture_output=True)
        full = f"tpb-full-{tag}"
        ours.call("POST", f"{API}/snapshots", resource("Snapshot", full, {"sandbox": source, "scope": "Full"}))
        wait_phase(ours, "snapshots", full, "Ready", 0.1)
        full_status = ours.call("GET", f"{API}/snapshots/{full}").get("status") or {}
        # The Workspace snapshot's sandbox: the same shape, the same bytes, all in /workspace.
        ws_source = f"tpb-wsrc-{tag}"
        ours.call("POST", f"{API}/sandboxes",
                  resource("Sandbox", ws_source, {"image": IMAGE, "readOnlyRootfs": False}))
        wait_phase(ours, "sandboxes", ws_source, "Running", 0.1)
        ours.exec(ws_source, SMALL)
        ours.exec(ws_source, workspace_extra(a.rootfs_mib))
        ws_snap = ours.call("POST", f"/v1/sandboxes/{ws_source}/snapshots", {})["id"]
        ws_status = (ours.call("GET", f"{API}/snapshots/{ws_snap}", expect=(200, 404)) or {}).get("status") or {}
        sizes = (f"Full: workspaceBytes {full_status.get('workspaceBytes')}, rootfsBytes "
                 f"{full_status.get('rootfsBytes')}; Workspace: workspaceBytes {ws_status.get('workspaceBytes')}")
        print(f"# {sizes}", flush=True)
        print(f"# source {source}, Full snapshot {full}; {ws_source}, Workspace snapshot {ws_snap}", flush=True)

        children = []
        for _ in range(n):
            ms, sb = ours.timed("POST", f"/v1/snapshots/{ws_snap}/fork", {}, expect=(201,))
            results["unpooled"].append(ms)
            children.append(sb["id"])
        for c in children:
            ours.call("DELETE", f"/v1/sandboxes/{c}")
        print("# unpooled forks done", flush=True)

        pool = f"tpb-pool-{tag}"
        ours.call("POST", f"{API}/sandboxpools",
                  resource("SandboxPool", pool, {"image": IMAGE, "size": n + 1, "readOnlyRootfs": False}))
        template = f"tpb-tpl-{tag}"
        ours.call("POST", f"{API}/sandboxtemplates",
                  resource("SandboxTemplate", template,
                           {"snapshot": full, "readOnlyRootfs": False, "pool": {"size": n + 1}}))
        wanted = {pool: n + 1, f"T-{template}": n + 1}
        print(f"# both pools filled in {wait_members(wanted):.0f} s", flush=True)
        ours.wait_pool(pool, n + 1)

        pooled_children, template_children = [], []

        def pooled():
            ms, sb = ours.timed("POST", f"/v1/snapshots/{ws_snap}/fork", {}, expect=(201,))
            results["pooled"].append(ms)
            pooled_children.append(sb["id"])

        def from_template(i: int):
            name = f"tpb-child-{tag}-{i}"
            start = time.perf_counter()
            answer = ours.call("POST", f"{API}/sandboxes", resource("Sandbox", name, {"template": template}))
            posted = time.perf_counter()
            gets = 0
            if ((answer or {}).get("status") or {}).get("phase") != "Running":
                gets = wait_phase(ours, "sandboxes", name, "Running", 0.002)
            results["template"].append((time.perf_counter() - start) * 1000.0)
            results["template POST alone"].append((posted - start) * 1000.0)
            results["GETs until Running"].append(gets)
            template_children.append(name)

        for i in range(n):
            steps = (pooled, lambda: from_template(i)) if i % 2 == 0 else (lambda: from_template(i), pooled)
            for step in steps:
                step()
            try:
                wait_members(wanted)
            except RuntimeError as error:
                odd.append(f"round {i}: {error}")
            time.sleep(1.0)
            print(f"# round {i}: pooled {results['pooled'][-1]:.0f} ms, template {results['template'][-1]:.0f} ms",
                  flush=True)

        # Untimed checks: every child claimed a member, and the template's children hold the
        # Full snapshot's root filesystem file and its workspace.
        pooled_claims = [claimed_from(ours, c) for c in pooled_children]
        template_claims = [claimed_from(ours, c) for c in template_children]
        for c in template_children:
            ours.exec(c, f"test $(wc -c < /usr/local/share/bench/blob) -eq {a.rootfs_mib << 20}"
                         " && test -s /workspace/small/f199.txt && test -s /workspace/data.bin")
        for c in pooled_children:
            ours.exec(c, f"test $(wc -c < /workspace/extra.bin) -eq {a.rootfs_mib << 20}")
        print(f"# pooled forks claimedFrom: {pooled_claims}", flush=True)
        print(f"# template children claimedFrom: {template_claims}", flush=True)
        if any(c != pool for c in pooled_claims):
            odd.append(f"not every pooled fork claimed from {pool}: {pooled_claims}")
        if any(c != f"T-{template}" for c in template_claims):
            odd.append(f"not every template child claimed from T-{template}: {template_claims}")
    finally:
        server_id = ours.server_id
        ours.stop()
        # The Full snapshot's image (cow.py's stop removes containers and volumes only).
        images = subprocess.run(
            ["docker", "images", "-q", "--filter", f"label=io.agent-sandbox.server={server_id}"],
            capture_output=True, text=True,
        ).stdout.split()
        for image in sorted(set(images)):
            subprocess.run(["docker", "rmi", "-f", image], capture_output=True)

    load = open("/proc/loadavg").read().split()[:3]
    print(f"\nruntime {runtime}, N = {n}, {a.rootfs_mib} MiB root filesystem changes, load average {' '.join(load)}, ms")
    print(f"snapshot sizes: {sizes}\n")
    print("| operation | median | p95 |")
    print("|---|---|---|")
    labels = {
        "pooled": "pooled `/v1` fork of the Workspace snapshot (POST → answer)",
        "template": "Sandbox from the template pool, Full snapshot (POST → GET shows Running, 2 ms polls)",
        "unpooled": "context: `/v1` fork of the Workspace snapshot, no pool (POST → answer)",
    }
    labels["template POST alone"] = "of which the POST alone (until it answers)"
    for key in ("pooled", "template", "template POST alone", "unpooled"):
        s = results[key]
        print(f"| {labels[key]} | {statistics.median(s):.0f} | {p95(s):.0f} |")
    ratio = statistics.median(results["template"]) / statistics.median(results["pooled"])
    ratio95 = p95(results["template"]) / p95(results["pooled"])
    print(f"\ntemplate pool ÷ pooled Workspace fork: median {ratio:.2f}, p95 {ratio95:.2f} (target ≤ 1.2)")
    for key, s in results.items():
        print(f"# {key} samples: {[round(x) for x in s]}")
    for line in odd:
        print(f"# odd: {line}")
    return 1 if odd else 0


if __name__ == "__main__":
    raise SystemExit(main())
