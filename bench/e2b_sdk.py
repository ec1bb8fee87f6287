"""E2B's Python SDK against this server, beside our own `/v1` for the same two operations, same
server, same run (issue 24's performance targets):

- create to the first command: `Sandbox.create(template)` until `commands.run("true")` has
  answered, the template a SandboxTemplate with a pool (target ≤ 60 ms median); beside it
  `POST /v1/sandboxes` (claiming from a SandboxPool of the same image) until
  `POST /v1/sandboxes/{id}/exec {"command": "true"}` has answered;
- a command on a running sandbox: `commands.run("true")` (target ≤ 10 ms median); beside it
  `POST /v1/sandboxes/{id}/exec {"command": "true"}`.

    target/e2b-venv/bin/python bench/e2b_sdk.py target/release/agent-sandbox [--n 20] [--m 100]

Needs the `e2b` SDK and httpx (tests/e2b/requirements.txt: the venv `bash tests/e2b/run.sh`
makes) and the Python test image (the SDK runs commands with bash). One server on a fresh data
directory (bench/cow.py's, `AGENT_SANDBOX_DOCKER_RUNTIME` picks the runtime, default runc); the
SDK is pointed at it with E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY only.

A SandboxTemplate `{image: python, pool: {size: N+1}}` and a SandboxPool `{image: python,
size: N+1}`; once both have N+1 running members, N rounds, alternating which goes first, each
sandbox killed untimed afterwards and both pools let refill between rounds. Every sandbox's
`status.claimedFrom` is checked (`T-<template>`, the pool's name). Then, on one running sandbox
of each, M commands each, interleaved, after 5 untimed ones. The second command on each new
sandbox is timed on its own (outside the create figures), to show what the first one pays.

To tell the SDK's own cost from the server's, the same rounds also time, untimed by the SDK:
the E2B create alone (`Sandbox.create`), and the same two requests the SDK makes sent by a bare
httpx client (`POST /e2b/sandboxes`, then envd's `process.Process/Start` as a Connect
server-streaming call read to its end) on the same kept-alive connection. Table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cow import API, Ours  # noqa: E402
from template_pool import claimed_from, members, p95, resource, wait_members  # noqa: E402

PYTHON_IMAGE = "agent-sandbox-test/python:latest"


def ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


def connect_frame(message: dict) -> bytes:
    """One Connect streaming envelope: flags 0, big-endian length, the JSON message."""
    body = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(body)) + body


def run_true(http, envd: str, sandbox_id: str, token: str) -> int:
    """envd's Start of `/bin/bash -l -c true` as the SDK sends it, read to its end; the exit code."""
    body = connect_frame({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "true"], "envs": {}},
                          "stdin": False})
    headers = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1",
               "E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983",
               "X-Access-Token": token}
    with http.stream("POST", f"{envd}/process.Process/Start", content=body, headers=headers) as r:
        data = r.read()
    if r.status_code != 200:
        raise RuntimeError(f"Start answered {r.status_code}: {data[:200]!r}")
    code, at = None, 0
    while at + 5 <= len(data):
        flags, length = struct.unpack(">BI", data[at:at + 5])
        message = json.loads(data[at + 5:at + 5 + length] or b"{}")
        at += 5 + length
        if flags & 2:
            if message.get("error"):
                raise RuntimeError(f"Start ended with {message['error']}")
            break
        end = ((message.get("event") or {}).get("end"))
        if end is not None:
            code = end.get("exitCode", 0)
    if code != 0:
        raise RuntimeError(f"true exited {code}")
    return code


def main() -> int:
    args = argparse.ArgumentParser()
    args.add_argument("binary")
    args.add_argument("--n", type=int, default=20, help="create rounds")
    args.add_argument("--m", type=int, default=100, help="commands on a running sandbox")
    a = args.parse_args()
    n, m = a.n, a.m
    runtime = os.environ.get("AGENT_SANDBOX_DOCKER_RUNTIME", "runc")
    tag = f"{os.getpid() % 100000}"
    results: dict = {k: [] for k in (
        "e2b create→run", "e2b create alone", "httpx create→Start", "httpx create alone",
        "v1 create→exec", "v1 create alone", "e2b second run", "v1 second exec",
        "e2b run", "httpx Start", "v1 exec")}
    odd: list = []
    ours = Ours(a.binary, True, runtime)
    base = f"http://127.0.0.1:{ours.port}"
    os.environ.update(E2B_API_URL=f"{base}/e2b", E2B_SANDBOX_URL=f"{base}/e2b/envd",
                      E2B_API_KEY=ours.key)
    for name in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        os.environ.pop(name, None)
    import httpx  # noqa: PLC0415 - after the environment is set, as the SDK reads it
    from e2b import Sandbox  # noqa: PLC0415

    http = httpx.Client(timeout=600)
    v1 = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {ours.key}"}, timeout=600)

    def v1_call(method: str, path: str, body=None) -> dict:
        r = v1.request(method, path, json=body)
        if r.status_code not in (200, 201, 204):
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:200]}")
        return r.json() if r.content else {}

    def v1_exec(sandbox_id: str) -> None:
        answer = v1_call("POST", f"/v1/sandboxes/{sandbox_id}/exec", {"command": "true"})
        if answer.get("exit_code") != 0:
            raise RuntimeError(f"exec true: {answer}")

    e2b_children, raw_children, v1_children = [], [], []
    tokens: dict = {}
    try:
        template, pool = f"e2bb-tpl-{tag}", f"e2bb-pool-{tag}"
        ours.call("POST", f"{API}/sandboxtemplates",
                  resource("SandboxTemplate", template, {"image": PYTHON_IMAGE, "pool": {"size": n + 1}}))
        ours.call("POST", f"{API}/sandboxpools",
                  resource("SandboxPool", pool, {"image": PYTHON_IMAGE, "size": n + 1}))
        wanted = {pool: n + 1, f"T-{template}": n + 1}
        print(f"# both pools filled in {wait_members(wanted):.0f} s", flush=True)

        def e2b_round():
            start = time.perf_counter()
            sbx = Sandbox.create(template, timeout=600)
            created = ms(start)
            result = sbx.commands.run("true")
            results["e2b create→run"].append(ms(start))
            results["e2b create alone"].append(created)
            if result.exit_code != 0:
                odd.append(f"e2b true exited {result.exit_code}")
            again = time.perf_counter()
            sbx.commands.run("true")
            results["e2b second run"].append(ms(again))
            e2b_children.append(sbx)

        def raw_round():
            start = time.perf_counter()
            r = http.post(f"{base}/e2b/sandboxes", headers={"X-API-Key": ours.key},
                          json={"templateID": template, "timeout": 600, "secure": True})
            created = ms(start)
            if r.status_code != 201:
                raise RuntimeError(f"POST /e2b/sandboxes: {r.status_code} {r.text[:200]}")
            doc = r.json()
            run_true(http, f"{base}/e2b/envd", doc["sandboxID"], doc.get("envdAccessToken") or "")
            results["httpx create→Start"].append(ms(start))
            results["httpx create alone"].append(created)
            raw_children.append(doc["sandboxID"])
            tokens[doc["sandboxID"]] = doc.get("envdAccessToken") or ""

        def v1_round():
            start = time.perf_counter()
            doc = v1_call("POST", "/v1/sandboxes", {"image": PYTHON_IMAGE, "timeout_seconds": 600})
            created = ms(start)
            v1_exec(doc["id"])
            results["v1 create→exec"].append(ms(start))
            results["v1 create alone"].append(created)
            again = time.perf_counter()
            v1_exec(doc["id"])
            results["v1 second exec"].append(ms(again))
            v1_children.append(doc["id"])

        rounds = [e2b_round, raw_round, v1_round]
        for i in range(n):
            for step in rounds[i % 3:] + rounds[:i % 3]:
                step()
            # Untimed: what each made is checked, killed, and both pools refill.
            claims = {
                "e2b": claimed_from(ours, e2b_children[-1].sandbox_id),
                "httpx": claimed_from(ours, raw_children[-1]),
                "v1": claimed_from(ours, v1_children[-1]),
            }
            want = {"e2b": f"T-{template}", "httpx": f"T-{template}", "v1": pool}
            for k, v in claims.items():
                if v != want[k]:
                    odd.append(f"round {i}: the {k} sandbox claimed from {v!r}, not {want[k]!r}")
            print(f"# round {i}: e2b {results['e2b create→run'][-1]:.0f} ms, httpx "
                  f"{results['httpx create→Start'][-1]:.0f} ms, v1 {results['v1 create→exec'][-1]:.0f} ms",
                  flush=True)
            if i < n - 1:
                e2b_children[-1].kill()
                v1_call("DELETE", f"/v1/sandboxes/{raw_children[-1]}")
                v1_call("DELETE", f"/v1/sandboxes/{v1_children[-1]}")
                try:
                    wait_members(wanted)
                except RuntimeError as error:
                    odd.append(f"round {i}: {error}")
                time.sleep(0.5)

        # A command on a running sandbox: the last round's sandboxes, warmed up untimed, once
        # both pools have refilled after the last round's claims (a refill starts containers).
        wait_members(wanted)
        time.sleep(2)
        sbx, raw_id, v1_id = e2b_children[-1], raw_children[-1], v1_children[-1]
        raw_token = tokens[raw_id]
        for _ in range(5):
            sbx.commands.run("true")
            run_true(http, f"{base}/e2b/envd", raw_id, raw_token)
            v1_exec(v1_id)
        for i in range(m):
            steps = [
                ("e2b run", lambda: sbx.commands.run("true")),
                ("httpx Start", lambda: run_true(http, f"{base}/e2b/envd", raw_id, raw_token)),
                ("v1 exec", lambda: v1_exec(v1_id)),
            ]
            for key, fn in steps[i % 3:] + steps[:i % 3]:
                start = time.perf_counter()
                fn()
                results[key].append(ms(start))
    finally:
        ours.stop()

    load = open("/proc/loadavg").read().split()[:3]
    print(f"\nruntime {runtime}, N = {n} creates, M = {m} commands, load average {' '.join(load)}, ms")
    print("\n| operation | median | p95 |")
    print("|---|---|---|")
    labels = {
        "e2b create→run": "E2B SDK: `Sandbox.create(template)` → first `commands.run(\"true\")` answered",
        "e2b create alone": "of which `Sandbox.create` alone",
        "httpx create→Start": "same two requests, bare httpx: `POST /e2b/sandboxes` → envd `Start` read to its end",
        "httpx create alone": "of which `POST /e2b/sandboxes` alone",
        "v1 create→exec": "`/v1`: `POST /v1/sandboxes` (SandboxPool) → `POST …/exec true` answered",
        "v1 create alone": "of which `POST /v1/sandboxes` alone",
        "e2b second run": "E2B SDK: the second `commands.run(\"true\")` on the new sandbox (untimed above)",
        "v1 second exec": "`/v1`: the second exec of `true` on the new sandbox (untimed above)",
        "e2b run": "E2B SDK: `commands.run(\"true\")` on a running sandbox",
        "httpx Start": "same request, bare httpx: envd `Start` of `true` read to its end",
        "v1 exec": "`/v1`: `POST /v1/sandboxes/{id}/exec` of `true`",
    }
    for key, label in labels.items():
        s = results[key]
        if s:
            print(f"| {label} | {statistics.median(s):.1f} | {p95(s):.1f} |")
    for key, s in results.items():
        print(f"# {key} samples: {[round(x, 1) for x in s]}")
    for line in odd:
        print(f"# odd: {line}")
    return 1 if odd else 0


if __name__ == "__main__":
    raise SystemExit(main())
