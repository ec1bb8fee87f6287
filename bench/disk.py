"""Write throughput into a disk-limited workspace (`spec.diskMB`) against an unlimited one, ours
only: one server, two sandboxes (diskMB 4096 and none), `dd` of N MiB with `conv=fsync` into
/workspace, interleaved rounds, medians. Standard library only.

    python3 bench/disk.py target/release/agent-sandbox [--rounds 7] [--mib 256]

`AGENT_SANDBOX_TEST_RUNTIME` picks the runtime (default runc). The server runs as root (disk
limits need it) on a fresh data directory; its sandboxes are deleted at the end. The table goes
to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request

API = "/apis/agent-sandbox.io/v1"
IMAGE = "agent-sandbox-test/busybox:latest"


class Server:
    def __init__(self, binary: str, runtime: str):
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="disk-bench-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.key = "bench-" + os.urandom(16).hex()
        env = {
            "PATH": os.environ.get("PATH", ""),
            "AGENT_SANDBOX_PORT": str(self.port),
            "AGENT_SANDBOX_DATA_DIR": str(self.tmp / "data"),
            "AGENT_SANDBOX_API_KEYS": self.key,
            "AGENT_SANDBOX_DEFAULT_IMAGE": IMAGE,
            "AGENT_SANDBOX_DOCKER_RUNTIME": runtime,
            "AGENT_SANDBOX_LOG": "warn",
        }
        self.log = open(self.tmp / "server.log", "w")
        self.proc = subprocess.Popen([binary, "serve"], env=env, stdout=self.log, stderr=self.log)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if self.call("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit("server not healthy")

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                text = resp.read()
                return resp.status, json.loads(text) if text else {}
        except urllib.error.HTTPError as e:
            return e.code, {}

    def sandbox(self, name: str, spec: dict) -> None:
        body = {"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                "metadata": {"name": name}, "spec": {"image": IMAGE, **spec}}
        code, out = self.call("POST", f"{API}/sandboxes", body)
        assert code == 201, (code, out)
        deadline = time.time() + 120
        while time.time() < deadline:
            _, doc = self.call("GET", f"{API}/sandboxes/{name}")
            if doc.get("status", {}).get("phase") == "Running":
                return
            time.sleep(0.2)
        raise SystemExit(f"{name} not running")

    def close(self, names: list[str]) -> None:
        for name in names:
            self.call("DELETE", f"{API}/sandboxes/{name}")
        deadline = time.time() + 60
        while time.time() < deadline and any(
            self.call("GET", f"{API}/sandboxes/{n}")[0] == 200 for n in names
        ):
            time.sleep(0.3)
        time.sleep(2)  # the disks' removal follows the volumes'
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)


def dd_mib_s(name: str, mib: int) -> float:
    script = (f"rm -f /workspace/f && dd if=/dev/zero of=/workspace/f bs=1M count={mib} "
              "conv=fsync 2>&1 && rm -f /workspace/f")
    start = time.perf_counter()
    out = subprocess.run(["docker", "exec", "-u", "1000:1000", f"agent-sandbox-{name}", "sh", "-c",
                          script], capture_output=True, text=True, check=True).stdout
    elapsed = time.perf_counter() - start
    match = re.search(r"copied, ([0-9.]+) s", out)
    seconds = float(match.group(1)) if match else elapsed
    return mib / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    runtime = os.environ.get("AGENT_SANDBOX_TEST_RUNTIME", "")
    server = Server(args.binary, runtime)
    suffix = os.urandom(4).hex()
    limited, plain = f"bench-disk-{suffix}", f"bench-plain-{suffix}"
    try:
        server.sandbox(limited, {"diskMB": 4096})
        server.sandbox(plain, {})
        dd_mib_s(limited, 16)
        dd_mib_s(plain, 16)
        rates: dict[str, list[float]] = {limited: [], plain: []}
        for i in range(args.rounds):
            order = [limited, plain] if i % 2 == 0 else [plain, limited]
            for name in order:
                rates[name].append(dd_mib_s(name, args.mib))
    finally:
        server.close([limited, plain])
    lim, pl = statistics.median(rates[limited]), statistics.median(rates[plain])
    print(f"runtime {runtime or 'runc'}, dd {args.mib} MiB conv=fsync, {args.rounds} rounds, medians")
    print(f"| workspace | MiB/s (median) | min | max |")
    print(f"| --- | --- | --- | --- |")
    for label, name in (("diskMB 4096 (own ext4, loop)", limited), ("no limit (Docker volume)", plain)):
        r = rates[name]
        print(f"| {label} | {statistics.median(r):.0f} | {min(r):.0f} | {max(r):.0f} |")
    print(f"ratio limited/unlimited: {lim / pl:.2f}")


if __name__ == "__main__":
    main()
