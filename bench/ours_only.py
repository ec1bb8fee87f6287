"""Measurements only our server can take: declarative manifests, Fork replicas and a 1 GiB
snapshot against plain tar. The idle cost of many declared sandboxes lives in `idle.py`.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import time

from common import API, API_VERSION, OpError, Results, Server, log, ms_since, write_atomic

POLL = 0.005


def sandbox_yaml(name: str, image: str, labels: dict | None = None, extra: str = "") -> str:
    label_text = "".join(f"\n    {k}: \"{v}\"" for k, v in (labels or {}).items())
    return (
        f"apiVersion: {API_VERSION}\nkind: Sandbox\nmetadata:\n  name: {name}\n"
        + (f"  labels:{label_text}\n" if labels else "")
        + f"spec:\n  image: {image}\n{extra}"
    )


def resource_destroy(results: Results, server: Server, n: int) -> None:
    """`DELETE` of a sandbox (made through `/v1` just before, untimed) through the resource API,
    until its 200 answer: the sandbox gone and its processes killed, as `/v1`'s destroy."""
    for _ in range(n):
        sandbox = server.create()
        path = f"{API}/sandboxes/{sandbox['id']}"
        results.measure("destroy (resource API)", server.name,
                        lambda: server.call("DELETE", path, expect=(200,)))


def is_converged(doc, generation_above: int = 0, container_not: str | None = None) -> bool:
    if not doc:
        return False
    meta, status = doc.get("metadata") or {}, doc.get("status") or {}
    generation = meta.get("generation") or 0
    return (
        status.get("phase") == "Running"
        and generation > generation_above
        and status.get("observedGeneration") == generation
        and (container_not is None or status.get("containerID") not in (None, container_not))
    )


def wait_converged(ours: Server, name: str, timeout: float = 120.0, **conditions) -> dict:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        doc = ours.resource("sandboxes", name)
        if is_converged(doc, **conditions):
            return doc
        status = (doc or {}).get("status") or {}
        if status.get("phase") == "Failed":
            raise OpError(f"{name} failed: {status.get('message')}")
        time.sleep(POLL)
    raise OpError(f"{name} not Running within {timeout:.0f} s")


def wait_gone(ours: Server, plural: str, names, timeout: float = 600.0) -> None:
    pending = set(names)
    deadline = time.perf_counter() + timeout
    while pending and time.perf_counter() < deadline:
        pending = {n for n in pending if ours.resource(plural, n) is not None}
        if pending:
            time.sleep(0.2)
    if pending:
        raise OpError(f"{len(pending)} {plural} still present after {timeout:.0f} s")


def manifest_to_running(
    results: Results, ours: Server, data_dir: pathlib.Path, n: int, suffix: str, refill=None
) -> None:
    """A new manifest, then two edits, each timed until GET shows the sandbox Running at the new
    generation: one that changes the env (applied in place), then one that makes the root
    filesystem writable (which needs a new container, so that one also waits for a new
    container ID). With warm pools, `refill()` waits until they are full again before each
    iteration, so that no refill competes with what is timed."""
    folder = data_dir / "manifests" / "sandboxes"
    folder.mkdir(parents=True, exist_ok=True)
    op_new = f"manifest new → Running{suffix}"
    op_env = f"manifest edit (env) → Running{suffix}"
    op_replace = f"manifest edit (new container) → Running{suffix}"
    names = []
    try:
        for i in range(n):
            if refill is not None:
                refill()
            name = f"bench-m{int(time.time() * 1000) % 10**9}-{i}"
            path = folder / f"{name}.yaml"
            names.append(name)
            start = time.perf_counter()
            try:
                write_atomic(path, sandbox_yaml(name, ours.image), data_dir)
                doc = wait_converged(ours, name)
                results.add(op_new, ours.name, ms_since(start))
            except Exception as error:  # noqa: BLE001
                results.fail(op_new, ours.name, error)
                continue
            env = f"  env:\n    BENCH_REVISION: \"{i + 1}\"\n"
            edits = [
                (op_env, env, False),
                (op_replace, env + "  readOnlyRootfs: false\n", True),
            ]
            for op, extra, new_container in edits:
                generation = doc["metadata"]["generation"]
                container = doc["status"].get("containerID") if new_container else None
                start = time.perf_counter()
                try:
                    write_atomic(path, sandbox_yaml(name, ours.image, extra=extra), data_dir)
                    doc = wait_converged(ours, name, generation_above=generation, container_not=container)
                    results.add(op, ours.name, ms_since(start))
                except Exception as error:  # noqa: BLE001
                    results.fail(op, ours.name, error)
                    break
    finally:
        for name in names:
            (folder / f"{name}.yaml").unlink(missing_ok=True)
        try:
            wait_gone(ours, "sandboxes", names)
        except Exception as error:  # noqa: BLE001
            log(f"manifest cleanup: {error}")


def convergence(results: Results, ours: Server, data_dir: pathlib.Path, count: int) -> None:
    """Time from writing `count` new manifests until all are Running; then their removal."""
    folder = data_dir / "manifests" / "sandboxes"
    folder.mkdir(parents=True, exist_ok=True)
    batch = f"c{int(time.time()) % 10**8}"
    names = [f"bench-{batch}-{i:03d}" for i in range(count)]
    op = f"{count} new manifests → all Running"
    try:
        start = time.perf_counter()
        for name in names:
            write_atomic(folder / f"{name}.yaml", sandbox_yaml(name, ours.image, {"bench-batch": batch}), data_dir)
        written = ms_since(start)
        deadline = time.perf_counter() + 900
        running = 0
        while time.perf_counter() < deadline:
            items = ours.resources("sandboxes", f"bench-batch={batch}")
            running = sum(1 for d in items if is_converged(d))
            if running == count:
                break
            time.sleep(0.1)
        if running != count:
            raise OpError(f"only {running} of {count} Running after 900 s")
        results.add(op, ours.name, ms_since(start))
        results.facts[f"{op}: writing the files took ms"] = round(written, 1)
    except Exception as error:  # noqa: BLE001
        results.fail(op, ours.name, error)
    finally:
        start = time.perf_counter()
        for name in names:
            (folder / f"{name}.yaml").unlink(missing_ok=True)
        try:
            wait_gone(ours, "sandboxes", names, timeout=900)
            results.add(f"{count} manifests removed → all gone", ours.name, ms_since(start))
        except Exception as error:  # noqa: BLE001
            results.fail(f"{count} manifests removed → all gone", ours.name, error)


def fork_replicas(results: Results, ours: Server, rounds: int, suffix: str = "", refill=None) -> None:
    """A Fork resource with 5 replicas against one with 1: time until every child is Running.

    With a warm pool, `suffix` names the rows and `refill()` waits until the pool is full again
    before each Fork."""
    sandbox_id, snap = None, None
    try:
        sandbox_id = ours.create()["id"]
        ours.exec(sandbox_id, "echo forked > /workspace/hello.txt")
        snap = ours.snapshot(sandbox_id)["id"]
    except Exception as error:  # noqa: BLE001
        for replicas in (1, 5):
            results.fail(f"Fork resource, {replicas} replica(s) → all Running{suffix}", ours.name, f"setup: {error}")
        if sandbox_id:
            ours.quietly(ours.destroy, sandbox_id)
        return
    try:
        for i in range(rounds):
            for replicas in (1, 5) if i % 2 == 0 else (5, 1):
                op = f"Fork resource, {replicas} replica(s) → all Running{suffix}"
                name = f"bench-fork-{int(time.time() * 1000) % 10**9}-{replicas}"
                if refill is not None:
                    refill()
                body = {
                    "apiVersion": API_VERSION,
                    "kind": "Fork",
                    "metadata": {"name": name},
                    "spec": {"snapshot": snap, "replicas": replicas},
                }
                start = time.perf_counter()
                try:
                    ours.call("POST", f"{API}/forks", json=body, expect=(200, 201))
                    deadline = time.perf_counter() + 300
                    while True:
                        fork = ours.resource("forks", name) or {}
                        status = fork.get("status") or {}
                        if status.get("readyReplicas", 0) >= replicas:
                            break
                        if status.get("phase") == "Failed":
                            raise OpError(f"fork failed: {status.get('message')}")
                        if time.perf_counter() > deadline:
                            raise OpError(f"{status.get('readyReplicas', 0)} of {replicas} ready after 300 s")
                        time.sleep(POLL)
                    results.add(op, ours.name, ms_since(start))
                except Exception as error:  # noqa: BLE001
                    results.fail(op, ours.name, error)
                finally:
                    ours.quietly(ours.call, "DELETE", f"{API}/forks/{name}")
                    try:
                        wait_gone(ours, "forks", [name])
                    except Exception as error:  # noqa: BLE001
                        log(f"fork cleanup: {error}")
    finally:
        ours.quietly(ours.delete_snapshot, snap)
        ours.quietly(ours.destroy, sandbox_id)


def big_snapshot(results: Results, ours: Server, work: pathlib.Path, mib: int, rounds: int) -> None:
    """Snapshot of a `mib` MiB workspace (16 files) against `tar -cf` of the same volume directory."""
    op_ours, op_tar = f"snapshot of {mib} MiB (ours)", f"plain tar -cf of {mib} MiB"
    op_sync = f"plain tar -cf + fsync of {mib} MiB"
    sandbox_id = None
    try:
        sandbox_id = ours.create()["id"]
        per_file = max(1, mib // 16)
        ours.exec(
            sandbox_id,
            f"i=0; while [ $i -lt 16 ]; do dd if=/dev/urandom of=/workspace/blob$i bs=1048576 "
            f"count={per_file} 2>/dev/null || exit 1; i=$((i+1)); done",
            timeout_seconds=1800,
        )
        doc = ours.resource("sandboxes", sandbox_id) or {}
        volume = (doc.get("status") or {}).get("workspaceVolume") or f"agent-sandbox-{sandbox_id}-workspace"
        mount = json.loads(
            subprocess.run(["docker", "volume", "inspect", volume], check=True, capture_output=True).stdout
        )[0]["Mountpoint"]
        data_bytes = 16 * per_file * 1048576
        out = work / "plain.tar"
        for _ in range(rounds):
            for fsync in (False, True):
                subprocess.run(["sync"], check=False)
                start = time.perf_counter()
                subprocess.run(["tar", "-cf", str(out), "-C", mount, "."], check=True)
                if fsync:
                    subprocess.run(["sync", str(out)], check=True)
                results.add(op_sync if fsync else op_tar, ours.name, ms_since(start))
                out.unlink(missing_ok=True)
            subprocess.run(["sync"], check=False)
            snap = results.measure(op_ours, ours.name, ours.snapshot, sandbox_id)
            if snap is not None:
                results.facts[f"{op_ours}: size_bytes"] = snap.get("size_bytes")
                ours.quietly(ours.delete_snapshot, snap["id"])
        results.facts["big snapshot data bytes"] = data_bytes
    except Exception as error:  # noqa: BLE001
        results.fail(op_ours, ours.name, error)
    finally:
        if sandbox_id:
            ours.quietly(ours.destroy, sandbox_id)
