#!/usr/bin/env python3
"""What scoped keys cost a `/v1` exec: the same binary started twice, once with only the
settings' admin key and once with a keys file, the exec path timed on each.

Two servers of the given binary run side by side, each with a throwaway data directory. Server A
has only `AGENT_SANDBOX_API_KEYS` (no keys file); server B also has `AGENT_SANDBOX_KEYS_FILE` with
an `edit` key for `default` made by `agent-sandbox keys create`, and every request to B uses that
key, so each goes through the keys file's lookup, the role and namespace decision and the audit
trail (an exec is audited). One sandbox on each; `--n` execs of `true` per server, alternating
A, B, B, A… on kept-alive connections so that load drifts hit both. Prints medians and the ratio
(the issue's target: B ≤ 1.05 × A at p50).

    python3 bench/authz.py target/release/agent-sandbox --n 300

Standard library only; removes the sandboxes and data directories afterwards.
"""

import argparse
import http.client
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import tempfile
import time

IMAGE = "agent-sandbox-test/busybox:latest"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary: str, keys_file: pathlib.Path | None, key: str):
        self.work = pathlib.Path(tempfile.mkdtemp(prefix="authz-bench-"))
        self.port = free_port()
        admin = "bench-admin-" + os.urandom(12).hex()
        env = {
            "PATH": os.environ.get("PATH", ""),
            "AGENT_SANDBOX_PORT": str(self.port),
            "AGENT_SANDBOX_DATA_DIR": str(self.work / "data"),
            "AGENT_SANDBOX_API_KEYS": admin,
            "AGENT_SANDBOX_DEFAULT_IMAGE": IMAGE,
            "AGENT_SANDBOX_LOG": "warn",
        }
        if keys_file:
            env["AGENT_SANDBOX_KEYS_FILE"] = str(keys_file)
        self.key = key or admin
        self.log = open(self.work / "server.log", "wb")
        self.proc = subprocess.Popen([binary, "serve"], env=env, stdout=self.log, stderr=self.log)
        self.conn = None
        deadline = time.time() + 60
        while True:
            try:
                self.call("GET", "/v1/sandboxes")
                break
            except (OSError, http.client.HTTPException):
                self.conn = None
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"the server did not start: see {self.work}/server.log")
                time.sleep(0.2)

    def call(self, method: str, path: str, body=None):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        self.conn.request(method, path, body=None if body is None else json.dumps(body),
                          headers=headers)
        response = self.conn.getresponse()
        text = response.read()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {text[:200]!r}")
        return json.loads(text) if text else None

    def close(self) -> None:
        for sandbox in (self.call("GET", "/v1/sandboxes") or {}).get("sandboxes", []):
            self.call("DELETE", f"/v1/sandboxes/{sandbox['id']}")
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()

    keys_dir = pathlib.Path(tempfile.mkdtemp(prefix="authz-bench-keys-"))
    keys_file = keys_dir / "keys.yaml"
    made = subprocess.run([args.binary, "keys", "create", "--file", str(keys_file), "--name",
                           "bench", "--namespace", "default", "--role", "edit"],
                          capture_output=True, text=True, check=True)
    scoped_key = made.stdout.strip()
    plain = Server(args.binary, None, "")
    scoped = Server(args.binary, keys_file, scoped_key)
    times = {"plain": [], "scoped": []}
    try:
        ids = {}
        for name, server in (("plain", plain), ("scoped", scoped)):
            ids[name] = server.call("POST", "/v1/sandboxes", {})["id"]
        for name, server in (("plain", plain), ("scoped", scoped)):
            for _ in range(20):  # warm the exec channel and the connection
                server.call("POST", f"/v1/sandboxes/{ids[name]}/exec", {"command": "true"})
        order = [("plain", plain), ("scoped", scoped)]
        for i in range(args.n):
            for name, server in (order if i % 2 == 0 else order[::-1]):
                start = time.perf_counter()
                answer = server.call("POST", f"/v1/sandboxes/{ids[name]}/exec", {"command": "true"})
                times[name].append((time.perf_counter() - start) * 1000.0)
                if answer.get("exit_code") != 0:
                    raise RuntimeError(f"exec on {name}: {answer}")
    finally:
        for server in (plain, scoped):
            try:
                server.close()
            except Exception as error:  # keep cleaning up the other one
                print(f"cleanup: {error}")
        shutil.rmtree(keys_dir, ignore_errors=True)
    p50 = {k: statistics.median(v) for k, v in times.items()}
    p95 = {k: sorted(v)[int(len(v) * 0.95) - 1] for k, v in times.items()}
    print(f"n = {args.n} each, load average {os.getloadavg()[0]:.1f}")
    print("| server | exec p50 | exec p95 |\n|---|---|---|")
    for k in ("plain", "scoped"):
        print(f"| {k} | {p50[k]:.2f} ms | {p95[k]:.2f} ms |")
    print(f"scoped ÷ plain at p50: {p50['scoped'] / p50['plain']:.3f} (target ≤ 1.05)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
