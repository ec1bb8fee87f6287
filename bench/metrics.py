"""`GET /metrics` with many declared sandboxes: how long a scrape takes, and the server's idle CPU
with and without a scrape every 15 s. Standard library only.

Starts its own server (the binary given, a throwaway data directory and key, on 127.0.0.1),
declares `--count` Sandbox manifests in its data directory in batches of 100 (the first
`--stopped` of them with `state: Stopped`: created, started and stopped once), waits until each
is Running or Stopped as declared, then measures:

- scrape latency: `--scrapes` sequential `GET /metrics` with the key, 0.2 s apart, each timed
  from the request to the last byte of the answer (the server's own cgroup reads of every
  running sandbox happen inside it);
- idle CPU: the server's utime + stime from /proc/<pid>/stat over `--window` seconds with no
  request at all, then over the same window with one scrape every `--scrape-interval` seconds.

Then it removes the manifests, waits until the server has deleted every sandbox, stops the server
and removes anything labeled with its identity. Prints the results as JSON.

    python3 bench/metrics.py --bin target/release/agent-sandbox --count 1000 --stopped 900
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

API = "/apis/agent-sandbox.io/v1"
SPEC = "  cpus: 0.05\n  memoryMB: 32\n  pidsLimit: 32\n"


def log(text: str) -> None:
    print(f"[metrics-bench] {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Straight to 127.0.0.1, whatever proxy the environment names.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settled(doc: dict) -> bool:
    meta, spec, status = doc.get("metadata", {}), doc.get("spec", {}), doc.get("status") or {}
    want = "Stopped" if spec.get("state") == "Stopped" else "Running"
    return status.get("phase") == want and status.get("observedGeneration") == meta.get("generation")


def sandboxes(url: str, key: str) -> list[dict]:
    status, body = get(f"{url}{API}/sandboxes?labelSelector=bench-metrics%3Dyes", key)
    if status != 200:
        raise RuntimeError(f"listing sandboxes answered {status}: {body[:200]!r}")
    return json.loads(body)["items"]


def wait_settled(url: str, key: str, want: int, stall: float = 300.0) -> None:
    last, since = -1, time.monotonic()
    while True:
        done = sum(1 for d in sandboxes(url, key) if settled(d))
        if done >= want:
            return
        if done != last:
            last, since = done, time.monotonic()
        elif time.monotonic() - since > stall:
            raise RuntimeError(f"stuck at {done} of {want} settled for {stall:.0f} s")
        time.sleep(1.0)


def idle_cpu(pid: int, window: float, scrape=None, every: float = 15.0) -> float:
    """Percent of one core over `window` seconds, scraping every `every` seconds if asked."""
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    next_scrape = start
    while (now := time.monotonic()) - start < window:
        if scrape and now >= next_scrape:
            scrape()
            next_scrape += every
        time.sleep(min(0.5, max(0.0, start + window - now)))
    return (cpu_seconds(pid) - start_cpu) / (time.monotonic() - start) * 100.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default="target/release/agent-sandbox")
    parser.add_argument("--image", default="agent-sandbox-test/busybox:latest")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--stopped", type=int, default=900)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--window", type=float, default=90.0)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    args = parser.parse_args()

    work = pathlib.Path(tempfile.mkdtemp(prefix="agent-sandbox-metrics-bench."))
    data = work / "data"
    port, key = free_port(), secrets.token_hex(16)
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SANDBOX_")}
    env.update(
        AGENT_SANDBOX_PORT=str(port), AGENT_SANDBOX_DATA_DIR=str(data), AGENT_SANDBOX_API_KEYS=key,
        AGENT_SANDBOX_DEFAULT_IMAGE=args.image, AGENT_SANDBOX_LOG="warn",
    )
    log_file = open(work / "server.log", "w")
    server = subprocess.Popen([args.bin, "serve"], env=env, stdout=log_file, stderr=log_file)
    results: dict = {"declared": args.count, "declared Stopped": args.stopped}
    folder = data / "manifests" / "sandboxes"
    names: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while get(f"{url}/healthz", None, 2)[0] != 200:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the server did not become healthy")
            time.sleep(0.2)
        folder.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        while len(names) < args.count:
            for i in range(len(names), min(args.count, len(names) + 100)):
                name = f"bench-metrics-{i:04d}"
                spec = SPEC + ("  state: Stopped\n" if i < args.stopped else "")
                text = (f"apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: {name}\n"
                        f"  labels:\n    bench-metrics: \"yes\"\nspec:\n  image: {args.image}\n{spec}")
                tmp = data / f".{name}.tmp"
                tmp.write_text(text)
                os.replace(tmp, folder / f"{name}.yaml")
                names.append(name)
            wait_settled(url, key, len(names))
            log(f"{len(names)} settled")
        results["time to declare and settle, s"] = round(time.monotonic() - start, 1)
        time.sleep(10)

        def scrape() -> tuple[float, bytes]:
            began = time.perf_counter()
            status, body = get(f"{url}/metrics", key)
            if status != 200:
                raise RuntimeError(f"/metrics answered {status}")
            return time.perf_counter() - began, body

        times, body = [], b""
        for _ in range(args.scrapes):
            elapsed, body = scrape()
            times.append(elapsed * 1000.0)
            time.sleep(0.2)
        times.sort()
        text = body.decode()
        results["scrape ms"] = {
            "median": round(statistics.median(times), 1),
            "p95": round(times[int(len(times) * 0.95) - 1], 1),
            "max": round(times[-1], 1),
            "samples": len(times),
        }
        results["exposition bytes"] = len(body)
        results["series"] = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        results["sandboxes with memory series"] = text.count("agent_sandbox_sandbox_memory_bytes{")
        log(f"scrapes: {results['scrape ms']}")
        results["idle CPU % of one core, no scrapes"] = round(idle_cpu(server.pid, args.window), 3)
        results[f"idle CPU % of one core, a scrape every {args.scrape_interval:g} s"] = round(
            idle_cpu(server.pid, args.window, scrape, args.scrape_interval), 3)
        results["window s"] = args.window
    finally:
        for name in names:
            (folder / f"{name}.yaml").unlink(missing_ok=True)
        start = time.monotonic()
        while names and server.poll() is None and time.monotonic() - start < 1800:
            try:
                if not sandboxes(url, key):
                    break
            except Exception:  # noqa: BLE001
                pass
            time.sleep(2)
        results["time to remove all, s"] = round(time.monotonic() - start, 1)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        server_id = (data / "server-id").read_text().strip() if (data / "server-id").exists() else ""
        if server_id:
            label = f"label=io.agent-sandbox.server={server_id}"
            for kind in (["ps", "-aq"], ["volume", "ls", "-q"]):
                ids = subprocess.run(["docker", *kind, "--filter", label], capture_output=True,
                                     text=True).stdout.split()
                if ids:
                    remove = ["rm", "-f", "-v"] if kind[0] == "ps" else ["volume", "rm", "-f"]
                    subprocess.run(["docker", *remove, *ids], capture_output=True)
        subprocess.run(["rm", "-rf", str(work)])
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
