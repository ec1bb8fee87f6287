"""The idle cost of many declared sandboxes: CPU and memory of the server process, and the Docker
calls that change something, while nothing changes and a periodic resync runs.

Sandboxes are declared as manifests in batches; before each batch the machine's available memory
is checked, and declaring stops early (and the report says so) when the next batch would leave
less than `reserve_mib` for everything else on the machine.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import time

from common import OpError, Results, Server, log, write_atomic
from ours_only import is_converged, sandbox_yaml

# Docker event actions that change the daemon's state (the rest — mount, unmount, die,
# exec_die, attach, top, … — are consequences or reads).
WRITE_ACTIONS = {
    "create", "start", "destroy", "update", "kill", "stop", "restart", "pause", "unpause",
    "rename", "remove", "delete", "exec_create", "exec_start", "prune",
}
CHEAP_SPEC = "  cpus: 0.05\n  memoryMB: 32\n  pidsLimit: 32\n"


def mem_available_mib() -> float:
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def cpu_ticks(pid: int) -> int:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)


def rss_mib(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def is_settled(doc) -> bool:
    """Running, or Stopped as its spec says, at its current generation."""
    if is_converged(doc):
        return True
    meta, status = (doc or {}).get("metadata") or {}, (doc or {}).get("status") or {}
    return (
        ((doc or {}).get("spec") or {}).get("state") == "Stopped"
        and status.get("phase") == "Stopped"
        and status.get("observedGeneration") == meta.get("generation")
    )


def count_running(ours: Server, batch: str) -> int:
    return sum(1 for d in ours.resources("sandboxes", f"bench-idle={batch}") if is_settled(d))


def docker_writes(since: float, until: float, server_id: str, volume_prefix: str) -> dict:
    """Docker events of our objects that change state, between two wall-clock times."""
    out = subprocess.run(
        ["docker", "events", "--since", f"{since:.3f}", "--until", f"{until:.3f}", "--format", "{{json .}}"],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout
    counts: dict[str, int] = {}
    objects: set[str] = set()
    for line in out.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        actor = event.get("Actor") or {}
        attributes = actor.get("Attributes") or {}
        kind = event.get("Type")
        ours = (kind == "container" and attributes.get("io.agent-sandbox.server") == server_id) or (
            kind == "volume" and str(actor.get("ID", "")).startswith(volume_prefix)
        )
        action = str(event.get("Action", "")).split(":")[0]
        if ours and action in WRITE_ACTIONS:
            key = f"{kind} {action}"
            counts[key] = counts.get(key, 0) + 1
            objects.add(f"{kind} {actor.get('ID', '')}")
    if objects:
        counts["distinct objects written"] = len(objects)
    return counts


def idle_scale(results: Results, ours: Server, data_dir: pathlib.Path, pid: int, server_id: str,
               target: int, window: float, resync: float, reserve_mib: float = 4096,
               stopped: int = 0, key: str = "idle") -> None:
    """Declares `target` sandboxes, the first `stopped` of them with `state: Stopped`, and
    measures the server at rest with them; facts go under `key`."""
    folder = data_dir / "manifests" / "sandboxes"
    folder.mkdir(parents=True, exist_ok=True)
    batch = f"i{int(time.time()) % 10**8}"
    names: list[str] = []
    facts = results.facts.setdefault(key, {})
    facts.update({"target sandboxes": target, "window seconds": window, "resync seconds": resync})
    if stopped:
        facts["of which declared Stopped"] = stopped
    try:
        rss_before = rss_mib(pid)
        mem_start = mem_available_mib()
        start = time.perf_counter()
        step, per_sandbox = 100, None
        while len(names) < target:
            room = mem_available_mib() - reserve_mib
            want = min(step, target - len(names))
            if per_sandbox is not None and per_sandbox * want > room:
                want = int(room // per_sandbox)
                if want <= 0:
                    facts["stopped early"] = (
                        f"declaring more would leave less than {reserve_mib:.0f} MiB available "
                        f"(about {per_sandbox:.1f} MiB per running sandbox on this machine)"
                    )
                    break
            for i in range(len(names), len(names) + want):
                name = f"bench-{batch}-{i:04d}"
                spec = CHEAP_SPEC + ("  state: Stopped\n" if i < stopped else "")
                write_atomic(folder / f"{name}.yaml",
                             sandbox_yaml(name, ours.image, {"bench-idle": batch}, spec), data_dir)
                names.append(name)
            _wait_running(ours, batch, len(names))
            per_sandbox = max(0.5, (mem_start - mem_available_mib()) / len(names))
            log(f"{key}: {len(names)} settled, ~{per_sandbox:.1f} MiB each, "
                f"{mem_available_mib():.0f} MiB available")
        facts["declared and Running"] = len(names)
        facts["time to declare and converge, s"] = round(time.perf_counter() - start, 1)
        facts["machine memory per sandbox, MiB"] = round(per_sandbox or 0, 1)
        facts["server RSS before declaring, MiB"] = round(rss_before, 1)
        time.sleep(max(10.0, resync / 2))  # let the last status writes and events settle
        ticks0, wall0, t0 = cpu_ticks(pid), time.time(), time.perf_counter()
        peak = rss_mib(pid)
        while time.perf_counter() - t0 < window:
            time.sleep(1.0)
            peak = max(peak, rss_mib(pid))
        ticks1, wall1, elapsed = cpu_ticks(pid), time.time(), time.perf_counter() - t0
        cpu = (ticks1 - ticks0) / os.sysconf("SC_CLK_TCK") / elapsed * 100.0
        writes = docker_writes(wall0, wall1, server_id, "agent-sandbox-bench-")
        facts["idle CPU % of one core"] = round(cpu, 3)
        facts["server RSS, MiB (end)"] = round(rss_mib(pid), 1)
        facts["server RSS, MiB (peak in window)"] = round(peak, 1)
        facts["docker writes in window"] = sum(v for k, v in writes.items() if k != "distinct objects written")
        facts["docker writes by action"] = writes
        still = count_running(ours, batch)
        facts["still Running after window"] = still
    except Exception as error:  # noqa: BLE001
        facts["error"] = " ".join(str(error).split())[:300]
        log(f"idle: error: {error}")
    finally:
        start = time.perf_counter()
        for name in names:
            (folder / f"{name}.yaml").unlink(missing_ok=True)
        deadline = time.perf_counter() + 1800
        left = len(names)
        while left and time.perf_counter() < deadline:
            time.sleep(2)
            try:
                left = len(ours.resources("sandboxes", f"bench-idle={batch}"))
            except Exception:  # noqa: BLE001
                pass
        facts["time to remove all, s"] = round(time.perf_counter() - start, 1)
        if left:
            facts["left after cleanup"] = left


def _wait_running(ours: Server, batch: str, want: int, stall: float = 300.0) -> None:
    last, last_change = -1, time.perf_counter()
    while True:
        running = count_running(ours, batch)
        if running >= want:
            return
        if running != last:
            last, last_change = running, time.perf_counter()
        elif time.perf_counter() - last_change > stall:
            raise OpError(f"stuck at {running} of {want} Running for {stall:.0f} s")
        time.sleep(1.0)
