"""Pause, stop and resume (ours only), with Docker's own stop and start in the same run.

One sandbox of the bench image, then `n` rounds of, in this order:

- pause: `POST …/sandboxes/{name}/pause` (`Paused`), timed until it answers (it answers once the
  controller reports the sandbox `Paused`);
- resume from Paused: `POST …/resume`, timed until it answers (the controller reports it
  `Running`); an exec right after, untimed, checks that it runs;
- exec that auto-resumes: pause again (untimed), then `/v1` exec of `true`, timed until it
  answers, the resume included;
- stop and resume from Stopped: the same routes with `Stopped`, each timed until it answers;
  resume is followed by the same untimed exec check;
- Docker alone: `stop` then `start` of a container of the same shape (our hardening, the same
  image, a named `/workspace` volume; see `docker_floor.py`), through the Engine API, each timed
  until the daemon answers. Ours and Docker's alternate round by round.

A plain exec on the running sandbox is timed too, for scale.
"""

from __future__ import annotations

import os
import tempfile
import time

import docker

from common import API, OpError, Results, Server, log, ms_since
from docker_floor import LOOPBACK_HOSTS, _create_start, _remove

# Our server's grace between SIGTERM and SIGKILL on stop; Docker's stop gets the same.
STOP_GRACE_SECONDS = 5


def _state(ours: Server, name: str, path: str, body=None) -> dict:
    return ours.call("POST", f"{API}/sandboxes/{name}/{path}", json=body, expect=(200,)).json()


def _check_runs(ours: Server, name: str) -> None:
    out = ours.exec(name, "echo up")
    if out.get("stdout") != "up\n":
        raise OpError(f"the resumed sandbox does not answer: {out}")


def pause_resume(results: Results, ours: Server, n: int) -> None:
    sandbox = ours.create()
    name = sandbox["id"]
    api = docker.APIClient(version="auto")
    fd, hosts = tempfile.mkstemp(prefix="bench-power-hosts-")
    with os.fdopen(fd, "w") as file:
        file.write(LOOPBACK_HOSTS)
    os.chmod(hosts, 0o444)
    twin = None
    try:
        twin = _create_start(api, ours.image, hosts)
        _check_runs(ours, name)
        for i in range(n):
            results.measure("exec on a running sandbox", ours.name, ours.exec, name, "true")

            results.measure("pause (→ Paused answered)", ours.name, _state, ours, name, "pause",
                            {"mode": "Paused"})
            results.measure("resume from Paused (→ Running answered)", ours.name, _state, ours,
                            name, "resume")
            _check_runs(ours, name)

            _state(ours, name, "pause", {"mode": "Paused"})
            results.measure("exec auto-resuming a Paused sandbox", ours.name, ours.exec, name,
                            "true")

            def ours_stop_start():
                results.measure("stop (→ Stopped answered)", ours.name, _state, ours, name,
                                "pause", {"mode": "Stopped"})
                results.measure("resume from Stopped (→ Running answered)", ours.name, _state,
                                ours, name, "resume")
                _check_runs(ours, name)

            def docker_stop_start():
                start = time.perf_counter()
                api.stop(twin[0], timeout=STOP_GRACE_SECONDS)
                results.add("Docker alone: stop of a container of the same shape", ours.name,
                            ms_since(start))
                start = time.perf_counter()
                api.start(twin[0])
                results.add("Docker alone: start of that stopped container", ours.name,
                            ms_since(start))

            for step in (ours_stop_start, docker_stop_start) if i % 2 == 0 else (
                    docker_stop_start, ours_stop_start):
                step()
        log("power: done")
    finally:
        ours.quietly(ours.destroy, name)
        if twin is not None:
            _remove(api, [twin])
        os.unlink(hosts)
        api.close()


def ratios(results: Results) -> dict:
    """Stop and resume from Stopped against Docker's stop and start (medians), for the report."""
    def median(op):
        s = results.series.get((op, "ours"))
        return s.median() if s and not s.errors and s.samples else None

    out = {}
    for ours_op, docker_op, key in (
        ("stop (→ Stopped answered)", "Docker alone: stop of a container of the same shape",
         "stop / Docker stop"),
        ("resume from Stopped (→ Running answered)", "Docker alone: start of that stopped container",
         "resume from Stopped / Docker start"),
    ):
        a, b = median(ours_op), median(docker_op)
        if a is not None and b:
            out[key] = a / b
    return out
