"""Shared pieces of the benchmark: HTTP access to a server, timing, results and statistics, and
(standard library only, for the scripts that need nothing else) a throwaway server with many
declared sandboxes (`Throwaway`).

Every measurement goes through `Results`, which keeps the samples of each (operation, server) pair
and the first error seen, so one failing operation shows up as an error in the table instead of
ending the run.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import secrets
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

API = "/apis/agent-sandbox.io/v1"
API_VERSION = "agent-sandbox.io/v1"


class OpError(Exception):
    """An operation did not give the answer it should have."""


class Server:
    """One server under test: its URL, key and a kept-alive HTTP client."""

    def __init__(self, name: str, url: str, key: str, image: str):
        self.name = name
        self.url = url
        self.key = key
        self.image = image
        self.client = self.new_client()

    def new_client(self) -> httpx.Client:
        import httpx  # only here: the throwaway-server scripts need the standard library alone

        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=httpx.Timeout(900.0, connect=10.0),
        )

    def call(self, method: str, path: str, *, expect=(200, 201, 204), client=None, **kw):
        response = (client or self.client).request(method, path, **kw)
        if response.status_code not in expect:
            text = " ".join(response.text.split())[:240]
            route = path.split("?")[0]
            raise OpError(f"{method} {route} answered {response.status_code}: {text}")
        return response

    # The /v1 wire contract, shared by both servers.

    def create(self, body=None) -> dict:
        return self.call("POST", "/v1/sandboxes", json=body or {}).json()

    def destroy(self, sandbox_id: str) -> None:
        self.call("DELETE", f"/v1/sandboxes/{sandbox_id}")

    def exec(self, sandbox_id: str, command, *, client=None, timeout_seconds=None) -> dict:
        body = {"command": command}
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        result = self.call(
            "POST", f"/v1/sandboxes/{sandbox_id}/exec", json=body, client=client
        ).json()
        if result.get("exit_code") != 0 or result.get("timed_out"):
            raise OpError(f"exec {command!r} failed: {result}")
        return result

    def snapshot(self, sandbox_id: str) -> dict:
        return self.call(
            "POST", f"/v1/sandboxes/{sandbox_id}/snapshots", json={"name": None}
        ).json()

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.call("DELETE", f"/v1/snapshots/{snapshot_id}", expect=(204, 404))

    def quietly(self, fn, *args) -> None:
        """Cleanup that must not hide the result of what came before."""
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - cleanup is best effort; run.sh sweeps what is left
            pass

    # Our resource API.

    def resource(self, plural: str, name: str):
        response = self.client.get(f"{API}/{plural}/{name}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise OpError(f"GET {plural}/{name} answered {response.status_code}: {response.text[:200]}")
        return response.json()

    def resources(self, plural: str, selector: str = "") -> list:
        params = {"labelSelector": selector} if selector else None
        return self.call("GET", f"{API}/{plural}", params=params).json().get("items", [])


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Series:
    samples: list = field(default_factory=list)
    errors: list = field(default_factory=list)

    def median(self):
        return statistics.median(self.samples) if self.samples else None

    def p95(self):
        return percentile(self.samples, 95) if self.samples else None

    def cell(self, unit: str = "ms") -> tuple[str, str]:
        """(median, p95) as table cells, or the error."""
        if not self.samples:
            reason = self.errors[0] if self.errors else "not measured"
            return (f"error: {reason}", "")
        med, p95 = fmt(self.median(), unit), fmt(self.p95(), unit)
        if self.errors:
            med += f" ({len(self.errors)} failed: {self.errors[0]})"
        return med, p95


def fmt(value, unit: str = "ms") -> str:
    if value is None:
        return "–"
    if unit == "ms":
        return f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return f"{value:.2f}"


class Results:
    """Samples per (operation, server), plus free-form ours-only findings."""

    def __init__(self):
        self.series: dict[tuple[str, str], Series] = {}
        self.order: list[str] = []
        self.facts: dict[str, object] = {}

    def get(self, op: str, server: str) -> Series:
        if op not in self.order:
            self.order.append(op)
        return self.series.setdefault((op, server), Series())

    def add(self, op: str, server: str, value_ms: float) -> None:
        self.get(op, server).samples.append(value_ms)

    def fail(self, op: str, server: str, error: Exception | str) -> None:
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        self.get(op, server).errors.append(reason)
        log(f"  {op} [{server}]: error: {reason}")

    def measure(self, op: str, server: str, fn, *args):
        """Times fn(*args); on failure records the error and returns None."""
        start = time.perf_counter()
        try:
            value = fn(*args)
        except Exception as error:  # noqa: BLE001 - the table shows it
            self.fail(op, server, error)
            return None
        self.add(op, server, ms_since(start))
        return value

    @classmethod
    def from_json(cls, data: dict) -> "Results":
        results = cls()
        for op, servers in data.get("operations", {}).items():
            for server, s in servers.items():
                series = results.get(op, server)
                series.samples = list(s.get("samples_ms", []))
                series.errors = list(s.get("errors", []))
        results.facts = dict(data.get("facts", {}))
        return results

    def to_json(self) -> dict:
        ops = {}
        for (op, server), s in self.series.items():
            ops.setdefault(op, {})[server] = {
                "samples_ms": s.samples,
                "median_ms": s.median(),
                "p95_ms": s.p95(),
                "errors": s.errors,
            }
        return {"operations": ops, "facts": self.facts}


def log(message: str) -> None:
    print(f"[bench] {message}", flush=True, file=__import__("sys").stderr)


def write_atomic(path: pathlib.Path, text: str, tmp_dir: pathlib.Path) -> None:
    """Writes a manifest the way an editor or `git checkout` would: whole, then renamed in."""
    tmp = tmp_dir / f".{path.name}.{os.getpid()}.tmp"
    tmp.write_text(text)
    os.replace(tmp, path)


# Straight to 127.0.0.1, whatever proxy the environment names.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, key: str | None, timeout: float = 60.0) -> tuple[int, bytes]:
    """Status and body; status 0 when the connection fails."""
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with OPENER.open(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError as error:
        return 0, str(error).encode()


def settled(doc: dict) -> bool:
    """Whether a listed sandbox is Running or Stopped as its spec says, for its current spec."""
    meta, spec, status = doc.get("metadata", {}), doc.get("spec", {}), doc.get("status") or {}
    want = "Stopped" if spec.get("state") == "Stopped" else "Running"
    return status.get("phase") == want and status.get("observedGeneration") == meta.get("generation")


class Throwaway:
    """A server of its own: the binary given, a throwaway data directory and key, on 127.0.0.1,
    plus any further `settings` (AGENT_SANDBOX_* variables), with Sandbox manifests declared in its data directory (`declare`). `close` removes the
    manifests, waits until the server has deleted every sandbox, stops it and removes anything
    Docker still holds labeled with its identity."""

    def __init__(self, binary: str, image: str, prefix: str, label: str,
                 settings: dict[str, str] | None = None):
        self.work = pathlib.Path(tempfile.mkdtemp(prefix=f"agent-sandbox-{prefix}-bench."))
        self.data = self.work / "data"
        self.folder = self.data / "manifests" / "sandboxes"
        self.image, self.label, self.names = image, label, []
        port, self.key = free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SANDBOX_")}
        env.update(
            AGENT_SANDBOX_PORT=str(port), AGENT_SANDBOX_DATA_DIR=str(self.data),
            AGENT_SANDBOX_API_KEYS=self.key, AGENT_SANDBOX_DEFAULT_IMAGE=image,
            AGENT_SANDBOX_LOG="warn",
        )
        env.update(settings or {})
        self.log_file = open(self.work / "server.log", "w")
        self.process = subprocess.Popen([binary, "serve"], env=env, stdout=self.log_file,
                                        stderr=self.log_file)
        deadline = time.monotonic() + 60
        while get(f"{self.url}/healthz", None, 2)[0] != 200:
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError("the server did not become healthy")
            time.sleep(0.2)

    def sandboxes(self) -> list[dict]:
        """The sandboxes this run declared (by their label)."""
        status, body = get(f"{self.url}{API}/sandboxes?labelSelector={self.label}%3Dyes", self.key)
        if status != 200:
            raise RuntimeError(f"listing sandboxes answered {status}: {body[:200]!r}")
        return json.loads(body)["items"]

    def wait_settled(self, want: int, stall: float = 300.0) -> None:
        last, since = -1, time.monotonic()
        while True:
            done = sum(1 for d in self.sandboxes() if settled(d))
            if done >= want:
                return
            if done != last:
                last, since = done, time.monotonic()
            elif time.monotonic() - since > stall:
                raise RuntimeError(f"stuck at {done} of {want} settled for {stall:.0f} s")
            time.sleep(1.0)

    def declare(self, count: int, spec: str, stopped, on_batch=None) -> None:
        """Declares `count` sandboxes `<label>-NNNN` in batches of 100 with `spec` (indented
        lines), `state: Stopped` for each index `stopped(i)` is true of; waits for each batch."""
        self.folder.mkdir(parents=True, exist_ok=True)
        while len(self.names) < count:
            for i in range(len(self.names), min(count, len(self.names) + 100)):
                name = f"{self.label}-{i:04d}"
                state = "  state: Stopped\n" if stopped(i) else ""
                text = (f"apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: {name}\n"
                        f"  labels:\n    {self.label}: \"yes\"\nspec:\n  image: {self.image}\n"
                        f"{spec}{state}")
                write_atomic(self.folder / f"{name}.yaml", text, self.data)
                self.names.append(name)
            self.wait_settled(len(self.names))
            if on_batch:
                on_batch(len(self.names))

    def close(self) -> float:
        """Removes everything; returns how long the server took to delete the sandboxes, s."""
        for name in self.names:
            (self.folder / f"{name}.yaml").unlink(missing_ok=True)
        start = time.monotonic()
        while self.names and self.process.poll() is None and time.monotonic() - start < 1800:
            try:
                if not self.sandboxes():
                    break
            except Exception:  # noqa: BLE001
                pass
            time.sleep(2)
        removal = time.monotonic() - start
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        id_file = self.data / "server-id"
        server_id = id_file.read_text().strip() if id_file.exists() else ""
        if server_id:
            label = f"label=io.agent-sandbox.server={server_id}"
            for kind in (["ps", "-aq"], ["volume", "ls", "-q"]):
                ids = subprocess.run(["docker", *kind, "--filter", label], capture_output=True,
                                     text=True).stdout.split()
                if ids:
                    remove = ["rm", "-f", "-v"] if kind[0] == "ps" else ["volume", "rm", "-f"]
                    subprocess.run(["docker", *remove, *ids], capture_output=True)
        subprocess.run(["rm", "-rf", str(self.work)])
        return removal
