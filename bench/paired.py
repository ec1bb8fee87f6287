"""Operations measured on both servers, interleaved: each iteration runs the operation once on
every server, alternating which one goes first, so that drift in the machine's load hits both alike.
"""

from __future__ import annotations

import os
import threading
import time

from common import OpError, Results, Server, log, ms_since

# 10 MiB of incompressible data plus 200 small files: the workspace snapshot, rollback and fork use.
POPULATE = (
    "dd if=/dev/urandom of=/workspace/data.bin bs=1048576 count=10 2>/dev/null"
    " && mkdir -p /workspace/small"
    " && i=0 && while [ $i -lt 200 ]; do echo \"file $i\" > /workspace/small/f$i.txt; i=$((i+1)); done"
)
FILE_PATH = "/workspace/bench-4k.bin"


def rounds(servers: list[Server], n: int):
    """Yields (iteration, server) with the first server alternating between iterations."""
    for i in range(n):
        order = servers if i % 2 == 0 else list(reversed(servers))
        for server in order:
            yield i, server


def create_destroy(results: Results, servers: list[Server], n: int, op: str = "create") -> None:
    """`create` with default limits, then `destroy` of the same sandbox."""
    for i in range(n):
        made = []
        order = servers if i % 2 == 0 else list(reversed(servers))
        for server in order:
            sb = results.measure(op, server.name, server.create)
            if sb is not None:
                made.append((server, sb["id"]))
        if op != "create":
            for server, sandbox_id in made:
                server.quietly(server.destroy, sandbox_id)
            continue
        for server, sandbox_id in reversed(made):
            results.measure("destroy", server.name, server.destroy, sandbox_id)


def stream_echo(server: Server, sandbox_id: str) -> None:
    path = f"/v1/sandboxes/{sandbox_id}/exec/stream"
    with server.client.stream("POST", path, json={"command": "echo hi"}) as response:
        if response.status_code != 200:
            response.read()
            raise OpError(f"POST exec/stream answered {response.status_code}: {response.text[:200]}")
        for line in response.iter_lines():
            if '"exit"' in line:
                if '"exit_code": 0' not in line and '"exit_code":0' not in line:
                    raise OpError(f"stream ended with {line.strip()}")
                return
    raise OpError("stream ended without an exit event")


def write_file(server: Server, sandbox_id: str, data: bytes) -> None:
    server.call(
        "PUT",
        f"/v1/sandboxes/{sandbox_id}/files",
        params={"path": FILE_PATH, "mode": "644"},
        content=data,
        headers={"Content-Type": "application/octet-stream"},
    )


def read_file(server: Server, sandbox_id: str, size: int) -> None:
    response = server.call(
        "GET", f"/v1/sandboxes/{sandbox_id}/files", params={"path": FILE_PATH}
    )
    if len(response.content) != size:
        raise OpError(f"read {len(response.content)} bytes, expected {size}")


def concurrent_execs(server: Server, sandbox_id: str, clients: list, per_client: int) -> None:
    """Wall time of len(clients) × per_client execs of `true`, each client on its own thread."""
    barrier = threading.Barrier(len(clients) + 1)
    errors: list[Exception] = []

    def work(client):
        barrier.wait()
        try:
            for _ in range(per_client):
                server.exec(sandbox_id, "true", client=client)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    barrier.wait()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def data_plane(results: Results, servers: list[Server], n: int) -> None:
    """exec, stream, write, read and 32 execs over 8 clients, on one sandbox per server."""
    boxes: dict[str, str] = {}
    try:
        for server in servers:
            try:
                boxes[server.name] = server.create()["id"]
            except Exception as error:  # noqa: BLE001
                for op in ("exec", "stream", "write", "read", "32 execs / 8 clients"):
                    results.fail(op, server.name, f"setup: {error}")
        live = [s for s in servers if s.name in boxes]
        data = os.urandom(4096)
        for server in live:  # warm-up, not timed
            server.quietly(server.exec, boxes[server.name], "true")
            server.quietly(write_file, server, boxes[server.name], data)
        log("exec")
        for _, s in rounds(live, n):
            results.measure("exec", s.name, s.exec, boxes[s.name], "true")
        log("stream")
        for _, s in rounds(live, n):
            results.measure("stream", s.name, stream_echo, s, boxes[s.name])
        log("write / read")
        for _, s in rounds(live, n):
            results.measure("write", s.name, write_file, s, boxes[s.name], data)
        for _, s in rounds(live, n):
            results.measure("read", s.name, read_file, s, boxes[s.name], len(data))
        log("32 execs over 8 concurrent clients")
        pools = {s.name: [s.new_client() for _ in range(8)] for s in live}
        try:
            for s in live:  # open every client's connection before timing
                for c in pools[s.name]:
                    s.quietly(s.exec, boxes[s.name], "true", c)
            for _, s in rounds(live, n):
                results.measure(
                    "32 execs / 8 clients", s.name, concurrent_execs, s, boxes[s.name], pools[s.name], 4
                )
        finally:
            for clients in pools.values():
                for c in clients:
                    c.close()
    finally:
        for server in servers:
            if server.name in boxes:
                server.quietly(server.destroy, boxes[server.name])


def snapshots(results: Results, servers: list[Server], n: int, pooled: bool = False) -> None:
    """snapshot, rollback and fork of a workspace of 10 MiB plus 200 small files.

    With `pooled`, our server has a warm pool: rollback and fork are measured as
    "rollback (warm pool)" and "fork (warm pool)" (the reference's column is taken at the same
    time, as for creates), and the one snapshot they need is taken untimed.
    """
    suffix = " (warm pool)" if pooled else ""
    ops = {op: op + suffix for op in ("snapshot", "rollback", "fork")}

    def who(server: Server) -> str:
        return "reference (same time)" if pooled and server.name == "reference" else server.name

    boxes: dict[str, str] = {}
    snaps: dict[str, list[str]] = {s.name: [] for s in servers}
    try:
        for server in servers:
            try:
                sandbox_id = server.create()["id"]
                boxes[server.name] = sandbox_id
                server.exec(sandbox_id, POPULATE, timeout_seconds=300)
            except Exception as error:  # noqa: BLE001
                for op in ops.values():
                    results.fail(op, who(server), f"setup: {error}")
                boxes.pop(server.name, None)
        live = [s for s in servers if s.name in boxes]
        log(ops["snapshot"])
        for _, s in rounds(live, 1 if pooled else n):
            if pooled:
                snaps[s.name].append(s.snapshot(boxes[s.name])["id"])
                continue
            snap = results.measure("snapshot", s.name, s.snapshot, boxes[s.name])
            if snap is not None:
                snaps[s.name].append(snap["id"])
                if snap.get("size_bytes", 0) < 10 * 1048576:
                    results.facts.setdefault("warnings", []).append(
                        f"{s.name}: snapshot of {snap.get('size_bytes')} bytes is smaller than the data"
                    )
        log(ops["rollback"])
        for _, s in rounds(live, n):
            if not snaps[s.name]:
                results.fail(ops["rollback"], who(s), "no snapshot to roll back to")
                continue
            body = {"snapshot_id": snaps[s.name][0]}
            path = f"/v1/sandboxes/{boxes[s.name]}/rollback"
            results.measure(
                ops["rollback"], who(s), lambda s=s, p=path, b=body: s.call("POST", p, expect=(200,), json=b)
            )
        log(ops["fork"])
        for i in range(n):
            order = live if i % 2 == 0 else list(reversed(live))
            forked = []
            for s in order:
                if not snaps[s.name]:
                    results.fail(ops["fork"], who(s), "no snapshot to fork")
                    continue
                path = f"/v1/snapshots/{snaps[s.name][0]}/fork"
                response = results.measure(
                    ops["fork"], who(s), lambda s=s, p=path: s.call("POST", p, expect=(201,), json={})
                )
                if response is not None:
                    forked.append((s, response.json()["id"]))
            for s, sandbox_id in forked:
                s.quietly(s.destroy, sandbox_id)
    finally:
        for server in servers:
            for snap in snaps[server.name]:
                server.quietly(server.delete_snapshot, snap)
            if server.name in boxes:
                server.quietly(server.destroy, boxes[server.name])


def wait_for_pool(ours: Server, name: str, size: int, timeout: float = 600.0) -> float:
    """Seconds until the pool reports `size` ready containers."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        pool = ours.resource("sandboxpools", name)
        ready = ((pool or {}).get("status") or {}).get("readyReplicas", 0)
        if ready >= size:
            return ms_since(start) / 1000.0
        time.sleep(0.25)
    raise OpError(f"pool {name} did not fill to {size} within {timeout:.0f} s")
