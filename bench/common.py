"""Shared pieces of the benchmark: HTTP access to a server, timing, results and statistics.

Every measurement goes through `Results`, which keeps the samples of each (operation, server) pair
and the first error seen, so one failing operation shows up as an error in the table instead of
ending the run.
"""

from __future__ import annotations

import math
import os
import pathlib
import statistics
import time
from dataclasses import dataclass, field

import httpx

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
