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
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import Throwaway, get  # noqa: E402

SPEC = "  cpus: 0.05\n  memoryMB: 32\n  pidsLimit: 32\n"


def log(text: str) -> None:
    print(f"[metrics-bench] {text}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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

    server = Throwaway(args.bin, args.image, "metrics", "bench-metrics")
    url, key = server.url, server.key
    results: dict = {"declared": args.count, "declared Stopped": args.stopped}
    try:
        start = time.monotonic()
        server.declare(args.count, SPEC, lambda i: i < args.stopped,
                       lambda n: log(f"{n} settled"))
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
        results["idle CPU % of one core, no scrapes"] = round(idle_cpu(server.process.pid, args.window), 3)
        results[f"idle CPU % of one core, a scrape every {args.scrape_interval:g} s"] = round(
            idle_cpu(server.process.pid, args.window, scrape, args.scrape_interval), 3)
        results["window s"] = args.window
    finally:
        results["time to remove all, s"] = round(server.close(), 1)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
