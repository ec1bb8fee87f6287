"""Ports: what it costs to reach a server inside a sandbox through the proxy and port-forward.

One sandbox of the Python test image runs a small HTTP/1.1 server on 127.0.0.1:8000 inside
(kept-alive connections, TCP_NODELAY as common servers set it; `/small` answers 1 KiB, `/big` a
256 MiB file of random bytes from `/workspace`, sent with sendfile). Measured in the same run:

- a proxied `GET /small` on a kept-alive client connection (httpx), p50 over many requests;
- `/big` downloaded by curl through the proxy, and through `agent-sandbox port-forward` (the
  CLI's local listener, one WebSocket per connection), against `docker exec CONTAINER cat` of
  the same file, the floor for bytes leaving a container over Docker's API. Rounds alternate
  the order of the three; throughput is the file's size over curl's (or the exec's) total time.

Run with the rest (`bash bench/run.sh -- --only ports`) or on its own against a running server:
`python3 bench/ports.py URL KEY AGENT_SANDBOX_BINARY [N]`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

from common import API, OpError, Results, Server, log, ms_since

OURS = "ours"
# The table lists ours-only rows; the Docker floor is a row of its own name there.
DOCKER = OURS
IMAGE = "agent-sandbox-test/python:latest"
PORT = 8000
BIG_MIB = 256
SMALL_OP = "proxied GET of 1 KiB, kept-alive"
PROXY_OP = f"{BIG_MIB} MiB download through the proxy"
FORWARD_OP = f"{BIG_MIB} MiB download through port-forward"
EXEC_OP = f"{BIG_MIB} MiB `docker exec … cat` of the same file"

SERVER = f"""
import http.server, os
os.makedirs("/workspace/www", exist_ok=True)
block = os.urandom(1 << 20)
with open("/workspace/www/big.tmp", "wb") as f:
    for _ in range({BIG_MIB}):
        f.write(block)
os.rename("/workspace/www/big.tmp", "/workspace/www/big")
SMALL = b"x" * 1024

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # As Go's net/http, Node and uvicorn do: without it the head and the body go out as two
    # small segments and the body waits for a delayed ACK (40 ms) of the head.
    disable_nagle_algorithm = True

    def do_GET(self):
        if self.path == "/big":
            with open("/workspace/www/big", "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                self.wfile.flush()
                self.connection.sendfile(f)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(SMALL)))
        self.end_headers()
        self.wfile.write(SMALL)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", {PORT}), Handler).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(ours: Server, name: str) -> str:
    """Starts sandbox `name` serving the files; its container."""
    doc = {
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": IMAGE, "memoryMB": 1024},
    }
    ours.call("POST", f"{API}/sandboxes", json=doc, expect=(201,))
    deadline = time.perf_counter() + 120
    while True:
        status = ours.call("GET", f"{API}/sandboxes/{name}").json().get("status", {})
        if status.get("phase") == "Running" and status.get("containerID"):
            container = status["containerID"]
            break
        if time.perf_counter() > deadline:
            raise OpError(f"sandbox {name} is not running: {status}")
        time.sleep(0.1)
    ours.call("POST", f"{API}/sandboxes/{name}/processes",
              json={"argv": ["python3", "-c", SERVER]}, expect=(201,))
    # It listens once the big file is written.
    while True:
        answer = ours.client.get(f"{API}/sandboxes/{name}/proxy/{PORT}/small")
        if answer.status_code == 200:
            break
        if time.perf_counter() > deadline:
            raise OpError(f"the server in {name} did not answer: {answer.status_code} {answer.text[:200]}")
        time.sleep(0.2)
    return container


def _curl(url: str, headers: list[str]) -> float:
    """Downloads url to nowhere; milliseconds, after checking every byte arrived."""
    args = ["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download} %{time_total}"]
    for h in headers:
        args += ["-H", h]
    out = subprocess.run(args + [url], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise OpError(f"curl {url}: {out.stderr.strip()[:200]}")
    size, seconds = out.stdout.split()
    if int(size) != BIG_MIB << 20:
        raise OpError(f"curl {url}: {size} bytes, expected {BIG_MIB << 20}")
    return float(seconds) * 1000


def _docker_cat(container: str) -> float:
    start = time.perf_counter()
    with subprocess.Popen(["docker", "exec", container, "cat", "/workspace/www/big"],
                          stdout=subprocess.PIPE) as proc:
        total = 0
        assert proc.stdout is not None
        while chunk := proc.stdout.read(1 << 20):
            total += len(chunk)
    if proc.returncode != 0 or total != BIG_MIB << 20:
        raise OpError(f"docker exec cat: exit {proc.returncode}, {total} bytes")
    return ms_since(start)


def _forwarder(binary: str, ours: Server, name: str) -> tuple[subprocess.Popen, int]:
    local = _free_port()
    env = dict(os.environ, AGENT_SANDBOX_URL=ours.url, AGENT_SANDBOX_API_KEY=ours.key)
    proc = subprocess.Popen([binary, "port-forward", name, f"{local}:{PORT}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.perf_counter() + 20
    while time.perf_counter() < deadline:
        try:
            socket.create_connection(("127.0.0.1", local), timeout=1).close()
            return proc, local
        except OSError:
            if proc.poll() is not None:
                raise OpError(f"port-forward exited: {proc.stderr.read().decode()[:200]}")
            time.sleep(0.1)
    proc.kill()
    raise OpError("port-forward did not listen within 20 s")


def small_requests(results: Results, ours: Server, name: str, n: int) -> None:
    client = ours.new_client()
    path = f"{API}/sandboxes/{name}/proxy/{PORT}/small"
    try:
        for i in range(n + 10):
            start = time.perf_counter()
            answer = client.get(path)
            elapsed = ms_since(start)
            if answer.status_code != 200 or len(answer.content) != 1024:
                raise OpError(f"GET small: {answer.status_code}, {len(answer.content)} bytes")
            if i >= 10:  # the first requests open the kept-alive connections
                results.add(SMALL_OP, OURS, elapsed)
    except OpError as error:
        results.fail(SMALL_OP, OURS, error)
    finally:
        client.close()


def downloads(results: Results, ours: Server, binary: str, name: str, container: str, rounds: int) -> None:
    auth = [f"Authorization: Bearer {ours.key}"]
    proxy_url = f"{ours.url}{API}/sandboxes/{name}/proxy/{PORT}/big"
    forward, local = _forwarder(binary, ours, name)
    try:
        steps = [
            (PROXY_OP, OURS, lambda: _curl(proxy_url, auth)),
            (FORWARD_OP, OURS, lambda: _curl(f"http://127.0.0.1:{local}/big", [])),
            (EXEC_OP, DOCKER, lambda: _docker_cat(container)),
        ]
        for r in range(rounds):
            for op, who, step in steps[r % 3:] + steps[:r % 3]:
                try:
                    results.add(op, who, step())
                except (OpError, subprocess.TimeoutExpired) as error:
                    results.fail(op, who, error)
    finally:
        forward.kill()
        forward.wait()
    for op, who in [(PROXY_OP, OURS), (FORWARD_OP, OURS), (EXEC_OP, DOCKER)]:
        median = results.get(op, who).median()
        if median:
            results.facts[f"{op}, MB/s (median)"] = round((BIG_MIB << 20) / 1e6 / (median / 1000), 0)
    floor = results.get(EXEC_OP, DOCKER).median()
    for op in (PROXY_OP, FORWARD_OP):
        ours_ms = results.get(op, OURS).median()
        if floor and ours_ms:
            results.facts[f"{op}: throughput as a ratio to docker exec cat"] = round(floor / ours_ms, 2)


def ports(results: Results, ours: Server, binary: str, n: int) -> None:
    log("ports: proxy and port-forward")
    name = f"bench-ports-{uuid.uuid4().hex[:8]}"
    try:
        container = _start(ours, name)
        small_requests(results, ours, name, max(n, 20) * 10)
        downloads(results, ours, binary, name, container, max(3, n // 4))
    except OpError as error:
        results.fail(SMALL_OP, OURS, error)
    finally:
        ours.quietly(ours.call, "DELETE", f"{API}/sandboxes/{name}")


if __name__ == "__main__":
    url, key, binary = sys.argv[1], sys.argv[2], sys.argv[3]
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    server = Server(OURS, url, key, IMAGE)
    res = Results()
    ports(res, server, binary, count)
    for operation in (SMALL_OP, PROXY_OP, FORWARD_OP):
        print(operation, res.get(operation, OURS).cell())
    print(EXEC_OP, res.get(EXEC_OP, DOCKER).cell())
    for fact, value in res.facts.items():
        print(f"{fact}: {value}")
