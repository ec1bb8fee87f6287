"""Full snapshots (ours only) against `docker commit` of the same container, in the same run.

One sandbox of the bench image with `read_only_rootfs: false`; as root (without capabilities, as
`docker exec -u 0` gives it) it writes `mib` MiB of random data into its root filesystem
(`/usr/local/share/bench/`, 16 files) and 1 MiB into `/workspace`. Then `n` rounds, alternating
which goes first:

- ours: `POST /v1/sandboxes/{id}/snapshots` with `{"scope": "Full"}`, timed until it answers
  (it answers once the snapshot is Ready: the sandbox frozen, its workspace read and stored, its
  root filesystem committed, the status written); the snapshot is deleted afterwards, untimed;
- Docker alone: `docker commit` (pause on, as Docker's default) of the same container through
  the Engine API, timed until the daemon answers; the image is removed afterwards, untimed.

Then, once, a sandbox from the Full snapshot (`spec.source`, no pool: its container is created
from the snapshot's image) timed from the POST until it is Running, for scale.
"""

from __future__ import annotations

import time

import docker

from common import API, API_VERSION, OpError, Results, Server, log, ms_since


def _wait_running(ours: Server, name: str, limit: float = 300.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        doc = ours.resource("sandboxes", name) or {}
        if (doc.get("status") or {}).get("phase") == "Running":
            return
        time.sleep(0.02)
    raise OpError(f"sandbox {name} not Running after {limit} s")


def _full(ours: Server, sandbox_id: str) -> dict:
    return ours.call("POST", f"/v1/sandboxes/{sandbox_id}/snapshots",
                     json={"scope": "Full"}).json()


def full_snapshot(results: Results, ours: Server, n: int, mib: int) -> None:
    op_ours = f"Full snapshot with {mib} MiB of root filesystem changes (ours)"
    op_commit = f"Docker alone: docker commit of the same container ({mib} MiB)"
    op_source = "sandbox from that Full snapshot (spec.source, no pool) → Running"
    api = docker.APIClient(version="auto")
    sandbox_id = None
    try:
        sandbox_id = ours.create({"read_only_rootfs": False})["id"]
        container = f"agent-sandbox-{sandbox_id}"
        per_file = max(1, mib // 16)
        script = (
            "mkdir -p /usr/local/share/bench && i=0; while [ $i -lt 16 ]; do "
            "dd if=/dev/urandom of=/usr/local/share/bench/blob$i bs=1048576 "
            f"count={per_file} 2>/dev/null || exit 1; i=$((i+1)); done"
        )
        exec_id = api.exec_create(container, ["sh", "-c", script], user="0")
        api.exec_start(exec_id)
        if api.exec_inspect(exec_id)["ExitCode"] != 0:
            raise OpError("writing the root filesystem changes failed")
        ours.exec(sandbox_id, "dd if=/dev/urandom of=/workspace/w bs=1048576 count=1 2>/dev/null")
        for i in range(n):
            def ours_round():
                snap = results.measure(op_ours, ours.name, _full, ours, sandbox_id)
                if snap is not None:
                    ours.quietly(ours.delete_snapshot, snap["id"])

            def commit_round():
                start = time.perf_counter()
                image = api.commit(container, repository="agent-sandbox-bench-commit", tag=str(i))
                results.add(op_commit, ours.name, ms_since(start))
                api.remove_image(image["Id"])

            for step in (ours_round, commit_round) if i % 2 == 0 else (commit_round, ours_round):
                step()
        # For scale: a sandbox started from a Full snapshot.
        snap = _full(ours, sandbox_id)
        child = f"bench-full-{int(time.time()) % 10**8}"
        doc = {
            "apiVersion": API_VERSION,
            "kind": "Sandbox",
            "metadata": {"name": child},
            "spec": {"image": ours.image, "readOnlyRootfs": False,
                     "source": {"snapshot": snap["id"]}},
        }
        start = time.perf_counter()
        ours.call("POST", f"{API}/sandboxes", json=doc, expect=(200, 201))
        _wait_running(ours, child)
        results.add(op_source, ours.name, ms_since(start))
        ours.quietly(ours.destroy, child)
        ours.quietly(ours.delete_snapshot, snap["id"])
    except Exception as error:  # noqa: BLE001
        log(f"full snapshot: {error}")
        results.fail(op_ours, ours.name, error)
    finally:
        if sandbox_id:
            ours.quietly(ours.destroy, sandbox_id)


def ratios(results: Results, mib: int) -> dict:
    ours = results.get(f"Full snapshot with {mib} MiB of root filesystem changes (ours)", "ours")
    commit = results.get(f"Docker alone: docker commit of the same container ({mib} MiB)", "ours")
    if not ours.samples or not commit.samples:
        return {}
    return {"Full snapshot ÷ docker commit (medians)": round(ours.median() / commit.median(), 2)}
