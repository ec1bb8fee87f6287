"""Declared services (`spec.services`): how soon a crashed service runs again after its exit.

Each sample edits the service (a new command line), which starts it afresh with its
crash count at zero; the service prints a line and exits 1, so its first restart is the
immediate one (later ones wait 1 s, 2 s, ... by design). The gap is the second run's
`startedAt` minus the first run's `finishedAt`, both from the in-sandbox supervisor's clock
(millisecond resolution), so no polling of ours is in it.

Run with the rest (`bash bench/run.sh -- --only services`) or on its own against a running
server: `python3 bench/services.py URL KEY [N]`.
"""

from __future__ import annotations

import datetime
import sys
import time
import uuid

from common import API, OpError, Results, Server, log

OURS = "ours"
OP = "first restart of a crashed service after its exit"


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _command(run: int) -> str:
    return f"echo run {run}; exit 1"


def _document(name: str, image: str, run: int) -> dict:
    return {
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {
            "image": image,
            "services": [
                {"name": "crash", "command": _command(run)}
            ],
        },
    }


def _runs(ours: Server, name: str, run: int) -> list[dict]:
    """The runs of the service's spec number `run` so far, oldest first."""
    items = ours.call("GET", f"{API}/sandboxes/{name}/processes").json()["items"]
    return sorted(
        (p for p in items if p.get("command") == _command(run)),
        key=lambda p: p["startedAt"],
    )


def first_restart(results: Results, ours: Server, n: int) -> None:
    name = f"bench-svc-{uuid.uuid4().hex[:8]}"
    ours.call("POST", f"{API}/sandboxes", json=_document(name, ours.image, 0), expect=(201,))
    try:
        for run in range(n + 1):
            if run:
                body = _document(name, ours.image, run)
                ours.call("PUT", f"{API}/sandboxes/{name}", json=body)
            # This spec's first two runs, ended (each edit changes the command, which tells the
            # runs of one spec from those of the one before).
            deadline = time.perf_counter() + 60
            while True:
                status = ours.call("GET", f"{API}/sandboxes/{name}").json().get("status", {})
                if status.get("phase") != "Running":
                    if time.perf_counter() > deadline:
                        raise OpError(f"sandbox {name} is not running: {status}")
                    time.sleep(0.05)
                    continue
                runs = [p for p in _runs(ours, name, run) if p.get("finishedAt")]
                if len(runs) >= 2:
                    break
                if time.perf_counter() > deadline:
                    raise OpError(f"service run {run} did not restart: {runs}")
                time.sleep(0.05)
            first, second = runs[0], runs[1]
            if run:
                gap = _time(second["startedAt"]) - _time(first["finishedAt"])
                results.add(OP, OURS, gap.total_seconds() * 1000)
    except OpError as error:
        results.fail(OP, OURS, error)
    finally:
        ours.quietly(ours.call, "DELETE", f"{API}/sandboxes/{name}")


def services(results: Results, ours: Server, n: int) -> None:
    log("services: first restart after a crash")
    first_restart(results, ours, n)


if __name__ == "__main__":
    url, key = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    server = Server(OURS, url, key, "agent-sandbox-test/busybox:latest")
    res = Results()
    services(res, server, count)
    series = res.get(OP, OURS)
    print(OP, series.cell())
    print(sorted(round(v, 1) for v in series.samples), series.errors)
