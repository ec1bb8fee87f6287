#!/usr/bin/env python3
"""Benchmark of agent-sandbox against the reference server (agent-sandbox 0.2.1), both running
on the same Docker daemon with the same image; plus measurements only our server can take.

Normally started by `bench/run.sh`, which builds and starts both servers. Prints a markdown
report (tables and the targets, met or not) and writes the raw samples as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import docker_floor  # noqa: E402
import idle  # noqa: E402
import ours_only  # noqa: E402
import paired  # noqa: E402
import ports  # noqa: E402
import power  # noqa: E402
import full_snapshot  # noqa: E402
import snapshot_archive  # noqa: E402
import processes  # noqa: E402
import services  # noqa: E402
from common import API, API_VERSION, Results, Server, fmt, log  # noqa: E402

OURS, REF = "ours", "reference"
# Operations measured while our server has a warm pool; the reference is timed at the same time.
WARM = " (warm pool)"

# (operation, ratio ours/reference at most) from the performance issues.
RATIO_TARGETS = [
    ("create (warm pool)", 0.1),
    ("create", 0.4),
    ("exec", 0.1),
    ("stream", 0.2),
    ("write", 0.5),
    ("read", 0.5),
    ("snapshot", 0.5),
    ("rollback", 0.2),
    ("fork", 0.2),
    ("rollback (warm pool)", 0.2),
    ("fork (warm pool)", 0.2),
    ("32 execs / 8 clients", 0.15),
]

# (operation, median at most, ms) from the long-lived processes issue.
PROCESS_TARGETS = [
    ("start a background process", 10.0),
    ("keystroke echoed by cat through an attach WebSocket", 3.0),
    ("replay of 8 MiB from offset 0 (base64, byte-exact)", 50.0),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ours-url", required=True)
    p.add_argument("--ours-key", required=True)
    p.add_argument("--ours-pid", type=int, required=True)
    p.add_argument("--ours-data", type=pathlib.Path, required=True)
    p.add_argument("--ref-url", required=True)
    p.add_argument("--ref-key", required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--ours-bin", default="agent-sandbox", help="our binary, for the CLI measurements")
    p.add_argument("--work", type=pathlib.Path, required=True, help="scratch directory on the data disk")
    p.add_argument("--resync-seconds", type=float, default=30.0)
    p.add_argument("--quick", action="store_true", help="5 iterations and small scale tests")
    p.add_argument("-n", "--iterations", type=int)
    p.add_argument("--idle-count", type=int, help="declared sandboxes for the idle measurement")
    p.add_argument("--only", default="", help="comma-separated sections to run (default: all)")
    p.add_argument("--skip", action="append", default=[], help="comma-separated sections to leave out")
    p.add_argument("--merge", type=pathlib.Path, help="results JSON of an earlier phase to report with these")
    p.add_argument("--json", type=pathlib.Path, help="write raw results here")
    p.add_argument("--markdown", type=pathlib.Path, help="write the report here too")
    args = p.parse_args()
    quick = args.quick
    args.n = args.iterations or (5 if quick else 20)
    args.converge = 20 if quick else 100
    args.idle_count = args.idle_count or (50 if quick else 1000)
    args.idle_window = 20.0 if quick else 60.0
    args.big_mib = 128 if quick else 1024
    args.big_rounds = 1 if quick else 2
    args.full_mib = 16 if quick else 100
    # Fork rounds are short but noisy (a Fork of one warm replica takes tens of milliseconds).
    args.fork_rounds = 3 if quick else 9
    return args


def has_pools(ours: Server) -> bool:
    try:
        return ours.client.get(f"{API}/sandboxpools").status_code == 200
    except Exception:  # noqa: BLE001
        return False


def with_pool(results: Results, ours: Server, size: int, body) -> None:
    """Runs body(pool name, size) while a SandboxPool of `size` containers of the bench image is full."""
    name = f"bench-pool-{int(time.time()) % 10**8}"
    doc = {
        "apiVersion": API_VERSION,
        "kind": "SandboxPool",
        "metadata": {"name": name},
        "spec": {"image": ours.image, "size": size, "readOnlyRootfs": True},
    }
    try:
        ours.call("POST", f"{API}/sandboxpools", json=doc, expect=(200, 201))
        seconds = paired.wait_for_pool(ours, name, size)
        results.facts[f"pool of {size} filled in s"] = round(seconds, 1)
        body(name, size)
    finally:
        ours.quietly(ours.call, "DELETE", f"{API}/sandboxpools/{name}")
        try:
            ours_only.wait_gone(ours, "sandboxpools", [name])
        except Exception as error:  # noqa: BLE001
            log(f"pool cleanup: {error}")


def machine() -> dict:
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
        info["cpu"] = cpu
    except (OSError, StopIteration):
        pass
    import os

    info["cores"] = os.cpu_count()
    info["memory GiB"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    info["kernel"] = platform.release()
    try:
        docker = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}} / {{.Driver}} / cgroup v{{.CgroupVersion}}"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip()
        info["docker (version / storage / cgroup)"] = docker
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def report(results: Results, args, info: dict) -> str:
    lines = [f"Run of {info['date']}, N = {args.n} iterations per operation and server.", ""]
    lines += [f"- {k}: {v}" for k, v in info.items() if k != "date"]
    lines += ["", "| operation | ours median ms | ours p95 ms | reference median ms | reference p95 ms | ours/ref (median) |",
              "|---|---|---|---|---|---|"]
    ratios = {}
    paired_ops = [op for op in results.order
                  if (op, REF) in results.series or (op, "reference (same time)") in results.series]
    for op in paired_ops:
        o = results.get(op, OURS)
        r = results.get(op, "reference" if not op.endswith(WARM) else "reference (same time)")
        om, op95 = o.cell()
        rm, rp95 = r.cell()
        ratio = "–"
        if o.median() is not None and r.median() is not None and not o.errors and not r.errors:
            ratios[op] = o.median() / r.median()
            ratio = f"{ratios[op]:.3f}"
        lines.append(f"| {op} | {om} | {op95} | {rm} | {rp95} | {ratio} |")
    lines += ["", "Ours only, and Docker alone (same run):", "", "| measurement | median | p95 | n |", "|---|---|---|---|"]
    ours_only_ops = [op for op in results.order if op not in paired_ops]
    for op in ours_only_ops:
        s = results.get(op, OURS)
        med, p95 = s.cell()
        lines.append(f"| {op} (ms) | {med} | {p95} | {len(s.samples)} |")
    lines += ["", "Facts:", "", "```", json.dumps(results.facts, indent=2, ensure_ascii=False), "```"]
    lines += ["", targets(results, ratios, args)]
    return "\n".join(lines)


def verdict(ok) -> str:
    return "–" if ok is None else ("met" if ok else "**not met**")


def targets(results: Results, ratios: dict, args) -> str:
    rows = ["| target | measured | met? |", "|---|---|---|"]
    for op, limit in RATIO_TARGETS:
        ratio = ratios.get(op)
        shown = f"{ratio:.3f}" if ratio is not None else _why(results, op)
        rows.append(f"| {op}: ours/ref ≤ {limit} | {shown} | {verdict(None if ratio is None else ratio <= limit)} |")
    for suffix, limit in ((" (warm pool)", 300.0), ("", 1000.0)):
        for kind in ("new", "edit (env)", "edit (new container)"):
            op = f"manifest {kind} → Running{suffix}"
            s = results.series.get((op, OURS))
            med = s.median() if s and not s.errors else None
            shown = f"median {fmt(med)} ms, p95 {fmt(s.p95())} ms" if med is not None else _why(results, op)
            rows.append(f"| {op} ≤ {limit:.0f} ms | {shown} | {verdict(None if med is None else med <= limit)} |")
    f = results.facts.get("idle", {})
    n = f.get("declared and Running", 0)
    scale = f"with {n} declared sandboxes" if n else ""
    cpu, rss, writes = f.get("idle CPU % of one core"), f.get("server RSS, MiB (peak in window)"), f.get("docker writes in window")
    rows.append(f"| idle CPU < 1 % ({args.idle_count} sandboxes) | {fmt(cpu, 'x') + ' % ' + scale if cpu is not None else f.get('error', 'not measured')} | {verdict(None if cpu is None else cpu < 1.0 and n >= args.idle_count)} |")
    rows.append(f"| server memory < 60 MB ({args.idle_count} sandboxes) | {fmt(rss, 'x') + ' MiB RSS ' + scale if rss is not None else 'not measured'} | {verdict(None if rss is None else rss * 1.048576 < 60 and n >= args.idle_count)} |")
    rows.append(f"| no Docker writes on idle resync | {str(writes) + ' ' + scale if writes is not None else 'not measured'} | {verdict(None if writes is None else writes == 0)} |")
    for op, limit in (("pause (→ Paused answered)", 20.0),
                      ("resume from Paused (→ Running answered)", 20.0),
                      ("exec auto-resuming a Paused sandbox", 30.0)):
        s = results.series.get((op, OURS))
        med = s.median() if s and not s.errors and s.samples else None
        shown = f"median {fmt(med)} ms, p95 {fmt(s.p95())} ms" if med is not None else _why(results, op)
        rows.append(f"| {op} ≤ {limit:.0f} ms (p50) | {shown} | {verdict(None if med is None else med <= limit)} |")
    for key, value in power.ratios(results).items():
        rows.append(f"| {key} ≤ 1.3 | {value:.3f} | {verdict(value <= 1.3)} |")
    for target, shown, ok in snapshot_archive.throughput(results, args.big_mib):
        rows.append(f"| {target} | {shown} | {verdict(ok)} |")
    for key, value in full_snapshot.ratios(results, args.full_mib).items():
        rows.append(f"| {key} ≤ 1.5 | {value:.2f} | {verdict(value <= 1.5)} |")
    f = results.facts.get("idle, 90 % Stopped", {})
    if f:
        n, cpu = f.get("declared and Running", 0), f.get("idle CPU % of one core")
        shown = (f"{fmt(cpu, 'x')} % with {n} declared, {f.get('of which declared Stopped', 0)} Stopped"
                 if cpu is not None else f.get("error", "not measured"))
        rows.append(f"| idle CPU < 1 % ({args.idle_count} sandboxes, 90 % Stopped) | {shown} | "
                    f"{verdict(None if cpu is None else cpu < 1.0 and n >= args.idle_count)} |")
    big = f"snapshot of {args.big_mib} MiB (ours)"
    so, st = results.series.get((big, OURS)), results.series.get((f"plain tar -cf of {args.big_mib} MiB", OURS))
    if so and st and so.median() and st.median():
        data = results.facts.get("big snapshot data bytes", args.big_mib * 1048576) / 1e6
        pct = st.median() / so.median() * 100
        shown = f"ours {data / (so.median() / 1000):.0f} MB/s, tar {data / (st.median() / 1000):.0f} MB/s: {pct:.0f} %"
        rows.append(f"| {args.big_mib} MiB snapshot ≥ 70 % of plain tar | {shown} | {verdict(pct >= 70)} |")
    else:
        rows.append(f"| {args.big_mib} MiB snapshot ≥ 70 % of plain tar | {_why(results, big)} | – |")
    for suffix in ("", WARM):
        one = results.series.get((f"Fork resource, 1 replica(s) → all Running{suffix}", OURS))
        five = results.series.get((f"Fork resource, 5 replica(s) → all Running{suffix}", OURS))
        if one and five and one.median() and five.median():
            x = five.median() / one.median()
            rows.append(f"| Fork of 5 < 2× one{suffix} | {fmt(five.median())} ms vs {fmt(one.median())} ms: {x:.2f}× | {verdict(x < 2)} |")
        else:
            rows.append(f"| Fork of 5 < 2× one{suffix} | {_why(results, f'Fork resource, 5 replica(s) → all Running{suffix}')} | – |")
    for op, limit in PROCESS_TARGETS:
        s = results.series.get((op, OURS))
        med = s.median() if s and not s.errors else None
        shown = f"median {fmt(med)} ms, p95 {fmt(s.p95())} ms" if med is not None else _why(results, op)
        rows.append(f"| {op} ≤ {limit:g} ms (p50) | {shown} | {verdict(None if med is None else med <= limit)} |")
    base = results.series.get(("/v1 exec of true (same run)", OURS))
    if base and base.median():
        rows.append(f"| (baseline) /v1 exec of true, same run | median {fmt(base.median())} ms, p95 {fmt(base.p95())} ms | – |")
    f = results.facts.get("100 followed processes, a line a second each", {})
    cpu = f.get("server CPU % of one core")
    rows.append(f"| 100 followed processes, a line a second: server < 2 % of one core | "
                f"{fmt(cpu, 'x') + ' %' if cpu is not None else 'not measured'} | {verdict(None if cpu is None else cpu < 2.0)} |")
    one = results.series.get(("Docker alone: 1 container(s) created and started at once", OURS))
    five = results.series.get(("Docker alone: 5 container(s) created and started at once", OURS))
    if one and five and one.median() and five.median():
        x = five.median() / one.median()
        rows.append(f"| (floor) Docker alone, 5 containers at once vs 1 | {fmt(five.median())} ms vs {fmt(one.median())} ms: {x:.2f}× | – |")
    return "\n".join(rows)


def _why(results: Results, op: str) -> str:
    for server in (OURS, REF):
        s = results.series.get((op, server))
        if s and s.errors:
            return f"error ({server}): {s.errors[0]}"
    return "not measured"


def main() -> int:
    args = parse_args()
    ours = Server(OURS, args.ours_url, args.ours_key, args.image)
    ref = Server(REF, args.ref_url, args.ref_key, args.image)
    server_id = (args.ours_data / "server-id").read_text().strip()
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    skip = {s.strip() for s in ",".join(args.skip).split(",") if s.strip()}
    results = Results()
    info = machine()
    if args.merge:
        earlier = json.loads(args.merge.read_text())
        results = Results.from_json(earlier)
        info = earlier.get("machine", info)
    pools = has_pools(ours)
    results.facts.setdefault("warm pool available", pools)

    def section(name, fn, *a):
        if (only and name not in only) or name in skip:
            return
        log(f"== {name}")
        try:
            fn(*a)
        except Exception as error:  # noqa: BLE001 - keep going; the section's ops show errors
            log(f"{name}: error: {error}")
            results.facts.setdefault("section errors", {})[name] = str(error)[:300]

    both = [ours, ref]
    section("create", paired.create_destroy, results, both, args.n)
    section("create", ours_only.resource_destroy, results, ours, args.n)
    section("docker", docker_floor.floor, results, OURS, args.image, args.n)
    section("dataplane", paired.data_plane, results, both, args.n)
    section("snapshots", paired.snapshots, results, both, args.n)
    section("manifests", ours_only.manifest_to_running, results, ours, args.ours_data, args.n, "")
    section("converge", ours_only.convergence, results, ours, args.ours_data, args.converge)
    if pools:
        def pooled(pool_name: str, pool_size: int):
            # Reference creates are taken at the same time, so the ratio compares like with like.
            for i in range(args.n):
                pair = [(OURS, "create (warm pool)", ours), (REF, "create (warm pool)", ref)]
                for _, op, server in pair if i % 2 == 0 else reversed(pair):
                    name = server.name if server is ours else "reference (same time)"
                    sb = results.measure(op, name, server.create)
                    if sb is not None:
                        server.quietly(server.destroy, sb["id"])
            # The edit that needs a new container makes the root filesystem writable: a second
            # pool holds members of that shape, as a user with such edits would keep.
            writable = f"{pool_name}-rw"
            doc = {"apiVersion": API_VERSION, "kind": "SandboxPool", "metadata": {"name": writable},
                   "spec": {"image": ours.image, "size": args.n, "readOnlyRootfs": False}}
            try:
                ours.call("POST", f"{API}/sandboxpools", json=doc, expect=(200, 201))

                def refill():
                    paired.wait_for_pool(ours, pool_name, pool_size)
                    paired.wait_for_pool(ours, writable, args.n)

                ours_only.manifest_to_running(results, ours, args.ours_data, args.n, WARM, refill)
            finally:
                ours.quietly(ours.call, "DELETE", f"{API}/sandboxpools/{writable}")
                ours.quietly(ours_only.wait_gone, ours, "sandboxpools", [writable])
            # Rollback and fork claim warm containers too; start them with the pool full again.
            paired.wait_for_pool(ours, pool_name, pool_size)
            paired.snapshots(results, both, args.n, pooled=True)
            ours_only.fork_replicas(results, ours, args.fork_rounds, WARM,
                                    refill=lambda: paired.wait_for_pool(ours, pool_name, pool_size))

        section("pool", with_pool, results, ours, max(args.n, 2 * args.n), pooled)
    elif not only or "pool" in only:
        results.fail("create (warm pool)", OURS, "this server has no SandboxPool resource")
    section("forks", ours_only.fork_replicas, results, ours, args.fork_rounds)
    section("bigsnapshot", ours_only.big_snapshot, results, ours, args.work, args.big_mib, args.big_rounds)
    section("archives", snapshot_archive.archives, results, ours, args.work, args.big_mib,
            args.big_rounds)
    section("power", power.pause_resume, results, ours, args.n)
    section("fullsnapshot", full_snapshot.full_snapshot, results, ours, args.n, args.full_mib)
    section("processes", processes.processes, results, ours, args.ours_pid, args.n)
    section("services", services.services, results, ours, args.n)
    section("ports", ports.ports, results, ours, args.ours_bin, args.n)
    section("idle", idle.idle_scale, results, ours, args.ours_data, args.ours_pid, server_id,
            args.idle_count, args.idle_window, args.resync_seconds)
    # Run on its own (`--only idle-stopped`) on a fresh server, as `idle` is.
    if "idle-stopped" in only:
        section("idle-stopped", idle.idle_scale, results, ours, args.ours_data, args.ours_pid,
                server_id, args.idle_count, args.idle_window, args.resync_seconds, 4096,
                args.idle_count * 9 // 10, "idle, 90 % Stopped")

    if "idle" in skip:
        results.facts["server RSS after the other measurements, MiB"] = round(idle.rss_mib(args.ours_pid), 1)
    text = report(results, args, info)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, **results.to_json()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
