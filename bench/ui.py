"""The dashboard's sandbox list with many sandboxes: how long until its first page is drawn in a real
headless Chromium. Standard library only (it speaks Chromium's DevTools protocol over a WebSocket
of its own).

Starts its own server (the binary given, a throwaway data directory and key, on 127.0.0.1),
declares `--count` Sandbox manifests in its data directory in batches of 100: the first
`--running` run (the oldest: on the first page, whose running sandboxes' stats the page asks for), the
rest with `state: Stopped`; waits until each is as declared. Then starts Chromium (`--headless`,
a throwaway profile), signs in through the sign-in form, and `--loads` times loads
`/ui#/sandboxes` afresh, reading how long after the navigation began the first page of rows was
painted (the page records `performance.now()` in the frame after the one that drew them:
`document.body.dataset.sandboxesDrawn`). Removes everything afterwards and prints the results as
JSON.

    python3 bench/ui.py --bin target/release/agent-sandbox --count 1000 --running 50
"""

from __future__ import annotations

import argparse
import base64
import json
import pathlib
import secrets
import socket
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import API, Throwaway, get  # noqa: E402

SPEC = "  cpus: 0.05\n  memoryMB: 32\n  pidsLimit: 32\n"


def log(text: str) -> None:
    print(f"[ui-bench] {text}", file=sys.stderr, flush=True)


class DevTools:
    """One DevTools session over a plain WebSocket (RFC 6455, client frames masked)."""

    def __init__(self, ws_url: str):
        rest = ws_url.removeprefix("ws://")
        authority, path = rest.split("/", 1)
        host, port = authority.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=120)
        key = base64.b64encode(secrets.token_bytes(16)).decode()
        self.sock.sendall((f"GET /{path} HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError(f"DevTools refused the WebSocket: {head!r}")
        self.next_id = 0
        # Network events seen while waiting for answers, kept when `record` is on.
        self.record = False
        self.events: list[dict] = []

    def _send(self, text: str) -> None:
        payload = text.encode()
        mask = secrets.token_bytes(4)
        n = len(payload)
        header = bytes([0x81])
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 65536:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise RuntimeError("DevTools closed the connection")
            data += chunk
        return data

    def _receive(self) -> str:
        message = b""
        while True:
            first, second = self._exactly(2)
            n = second & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exactly(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exactly(8))[0]
            message += self._exactly(n)
            if first & 0x80:
                return message.decode()

    def call(self, method: str, params: dict | None = None) -> dict:
        self.next_id += 1
        self._send(json.dumps({"id": self.next_id, "method": method, "params": params or {}}))
        while True:
            reply = json.loads(self._receive())
            if self.record and reply.get("method", "").startswith("Network."):
                self.events.append(reply)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def eval(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        return result["result"].get("value")

    def wait(self, expression: str, limit: float = 60.0):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.01)
        raise RuntimeError(f"timed out waiting for {expression}")


def start_chromium(profile: pathlib.Path) -> tuple[subprocess.Popen, DevTools]:
    chromium = subprocess.Popen(
        ["chromium", "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--disable-extensions", "--disable-background-networking",
         "--window-size=1400,1000", "--remote-debugging-address=127.0.0.1",
         "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    browser_url = ""
    for line in chromium.stderr:
        if line.startswith("DevTools listening on "):
            browser_url = line.split(" on ", 1)[1].strip()
            break
    authority = browser_url.removeprefix("ws://").split("/")[0]
    _, body = get(f"http://{authority}/json/list", None)
    page = next(t for t in json.loads(body) if t["type"] == "page")
    tools = DevTools(page["webSocketDebuggerUrl"])
    tools.call("Page.enable")
    tools.call("Runtime.enable")
    return chromium, tools


def slow_load_requests(events: list[dict]) -> list[str]:
    """Each request of a load, in the order sent: when it was sent, when its answer's head came
    and when it ended (seconds after the first request), and where its time went."""
    requests: dict[str, dict] = {}
    first = None
    for event in events:
        params = event.get("params", {})
        rid = params.get("requestId")
        if rid is None:
            continue
        r = requests.setdefault(rid, {})
        stamp = params.get("timestamp")
        if first is None and stamp is not None:
            first = stamp
        method = event["method"]
        if method == "Network.requestWillBeSent":
            r["url"] = params["request"]["url"].split("/", 3)[-1][:70]
            r["sent"] = stamp
        elif method == "Network.responseReceived":
            r["head"] = stamp
            timing = params["response"].get("timing") or {}
            r["timing"] = {k: round(timing[k], 1) for k in ("dnsStart", "connectStart", "sendStart",
                                                          "receiveHeadersEnd") if k in timing}
            r["socket"] = params["response"].get("connectionId")
            r["reused"] = params["response"].get("connectionReused")
        elif method in ("Network.loadingFinished", "Network.loadingFailed"):
            r["end"] = stamp
            r["failed"] = params.get("errorText")
    lines = []
    for r in sorted(requests.values(), key=lambda r: r.get("sent") or 0):
        at = lambda k: f"{r[k] - first:7.3f}" if r.get(k) is not None and first else "      -"
        lines.append(f"sent {at('sent')} head {at('head')} end {at('end')} "
                     f"socket {r.get('socket')} reused {r.get('reused')} {r.get('timing', {})} "
                     f"{r.get('failed') or ''} {r.get('url', '?')}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default="target/release/agent-sandbox")
    parser.add_argument("--image", default="agent-sandbox-test/busybox:latest")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--running", type=int, default=50)
    parser.add_argument("--loads", type=int, default=20)
    args = parser.parse_args()

    server = Throwaway(args.bin, args.image, "ui", "bench-ui")
    url, key = server.url, server.key
    results: dict = {"declared": args.count, "running": args.running}
    chromium = None
    try:
        start = time.monotonic()
        # The first `--running` are among the oldest: on the first page of the list.
        server.declare(args.count, SPEC, lambda i: i >= args.running,
                       lambda n: log(f"{n} settled"))
        results["time to declare and settle, s"] = round(time.monotonic() - start, 1)
        for query in ("", "?limit=50"):
            _, body = get(f"{url}{API}/sandboxes{query}", key)
            results[f"list bytes{', first page' if query else ''}"] = len(body)
            began = time.perf_counter()
            for _ in range(10):
                get(f"{url}{API}/sandboxes{query}", key)
            results[f"list ms{', first page' if query else ''} (mean of 10)"] = round(
                (time.perf_counter() - began) * 100.0, 1)

        chromium, tools = start_chromium(server.work / "profile")
        tools.call("Page.navigate", {"url": f"{url}/ui"})
        tools.wait("document.getElementById('sign-in')")
        tools.eval(f"document.getElementById('key').value = {json.dumps(key)}; "
                   "document.getElementById('sign-in').submit(); true")
        tools.wait("document.body && document.body.dataset.sandboxesDrawn")
        times = []
        tools.call("Network.enable")
        tools.record = True
        for _ in range(args.loads):
            before = list(tools.events)
            tools.events.clear()
            tools.call("Page.navigate", {"url": f"{url}/ui?load={time.monotonic_ns()}#/sandboxes"})
            drawn = tools.wait("document.body && document.body.dataset.sandboxesDrawn")
            if float(drawn) > 2000:
                # A slow load: say where its time went, request by request, from the previous
                # load on (its requests may be what this one waited for).
                log(f"slow load ({float(drawn):.0f} ms):")
                for line in slow_load_requests(before + tools.events):
                    log(f"  {line}")
            rows = tools.eval("document.querySelectorAll('#sandbox-rows tr').length")
            count = tools.eval("document.getElementById('sandbox-count').textContent")
            if rows != 50 or count != f"{args.count} of {args.count}":
                raise RuntimeError(f"the first page shows {rows} rows, {count!r}")
            times.append(float(drawn))
            time.sleep(0.5)
        times.sort()
        results["first page painted, ms after navigation"] = {
            "median": round(statistics.median(times), 1),
            "p95": round(times[max(0, int(len(times) * 0.95) - 1)], 1),
            "max": round(times[-1], 1),
            "loads": len(times),
        }
        log(f"{results['first page painted, ms after navigation']}")
    finally:
        if chromium:
            chromium.kill()
            chromium.wait()
        server.close()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
