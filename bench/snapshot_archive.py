"""Snapshot archives (ours only): export and import of a `mib` MiB snapshot against plain `tar`
of the same bytes on the same disk, in the same run.

One sandbox writes `mib` MiB of random bytes into `/workspace` (16 files) and a Workspace
snapshot of it is taken, untimed. Then `rounds` rounds of:

- plain `tar -cf` of the sandbox's workspace volume directory into a file of the scratch
  directory, then `sync` of that file (the baseline for the export);
- ours, export: `GET .../snapshots/{name}/export` streamed by the client into a file of the same
  scratch directory, then `sync` of it;
- plain `tar -xf` of that plain tar into a fresh directory of the scratch directory, then `sync`
  (the baseline for the import);
- ours, import: `POST .../snapshots/import?name=` with the exported file as the streamed body,
  timed until the server answers 201 (it has read, checked, hashed and fsync'd the data, and the
  snapshot is Ready); the imported snapshot is deleted afterwards, untimed;
- the export and the import again with `curl` as the client (`-o file` then `sync`; `-T file`),
  to tell the server's throughput from the Python client's.

Throughput is the workspace's data bytes over the median time; the ratio is ours ÷ tar.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import time

from common import API, Results, Server, log, ms_since

OPS = (
    "snapshot archive export of {mib} MiB (ours, client to file + sync)",
    "plain tar -cf + sync of {mib} MiB",
    "snapshot archive import of {mib} MiB (ours, file to Ready)",
    "plain tar -xf + sync of {mib} MiB",
    "snapshot archive export of {mib} MiB (ours, curl to file + sync)",
    "snapshot archive import of {mib} MiB (ours, curl, file to Ready)",
)


def _ops(mib: int) -> tuple[str, ...]:
    return tuple(op.format(mib=mib) for op in OPS)


def _sync(path: pathlib.Path) -> None:
    subprocess.run(["sync", str(path)], check=True)


def archives(results: Results, ours: Server, work: pathlib.Path, mib: int, rounds: int) -> None:
    op_export, op_tar_c, op_import, op_tar_x, op_curl_export, op_curl_import = _ops(mib)
    auth = f"Authorization: Bearer {ours.key}"
    sandbox_id = snap = None
    try:
        sandbox_id = ours.create()["id"]
        per_file = max(1, mib // 16)
        ours.exec(
            sandbox_id,
            f"i=0; while [ $i -lt 16 ]; do dd if=/dev/urandom of=/workspace/blob$i bs=1048576 "
            f"count={per_file} 2>/dev/null || exit 1; i=$((i+1)); done",
            timeout_seconds=1800,
        )
        doc = ours.resource("sandboxes", sandbox_id) or {}
        volume = (doc.get("status") or {}).get("workspaceVolume") or f"agent-sandbox-{sandbox_id}-workspace"
        mount = json.loads(
            subprocess.run(["docker", "volume", "inspect", volume], check=True, capture_output=True).stdout
        )[0]["Mountpoint"]
        snap = ours.snapshot(sandbox_id)["id"]
        results.facts["snapshot archive data bytes"] = 16 * per_file * 1048576
        plain, exported, unpacked = work / "archive-plain.tar", work / "archive-export.tar", work / "archive-x"
        client = ours.new_client()
        for i in range(rounds):
            subprocess.run(["sync"], check=False)
            start = time.perf_counter()
            subprocess.run(["tar", "-cf", str(plain), "-C", mount, "."], check=True)
            _sync(plain)
            results.add(op_tar_c, ours.name, ms_since(start))

            subprocess.run(["sync"], check=False)
            start = time.perf_counter()
            with client.stream("GET", f"{API}/snapshots/{snap}/export") as response:
                if response.status_code != 200:
                    raise RuntimeError(f"export answered {response.status_code}")
                with open(exported, "wb") as out:
                    for piece in response.iter_bytes(1 << 20):
                        out.write(piece)
                    out.flush()
                    os.fsync(out.fileno())
            results.add(op_export, ours.name, ms_since(start))
            # The same with curl: what the server gives when the client is not Python.
            exported.unlink()
            subprocess.run(["sync"], check=False)
            start = time.perf_counter()
            subprocess.run(["curl", "-sSf", "-H", auth, "-o", str(exported),
                            f"{ours.url}{API}/snapshots/{snap}/export"], check=True)
            _sync(exported)
            results.add(op_curl_export, ours.name, ms_since(start))

            shutil.rmtree(unpacked, ignore_errors=True)
            unpacked.mkdir()
            subprocess.run(["sync"], check=False)
            start = time.perf_counter()
            subprocess.run(["tar", "-xf", str(plain), "-C", str(unpacked)], check=True)
            subprocess.run(["sync", "-f", str(unpacked)], check=True)
            results.add(op_tar_x, ours.name, ms_since(start))
            shutil.rmtree(unpacked, ignore_errors=True)
            plain.unlink(missing_ok=True)

            name = f"bench-imported-{int(time.time()) % 10**8}-{i}"
            size = exported.stat().st_size
            subprocess.run(["sync"], check=False)
            start = time.perf_counter()
            with open(exported, "rb") as body:
                ours.call("POST", f"{API}/snapshots/import", params={"name": name},
                          content=iter(lambda: body.read(1 << 20), b""),
                          headers={"Content-Length": str(size)}, client=client, expect=(201,))
            results.add(op_import, ours.name, ms_since(start))
            ours.quietly(ours.delete_snapshot, name)
            subprocess.run(["sync"], check=False)
            start = time.perf_counter()
            subprocess.run(["curl", "-sSf", "-o", "/dev/null", "-H", auth, "-H", "Expect:",
                            "-H", "Content-Type: application/octet-stream", "-X", "POST",
                            "-T", str(exported),
                            f"{ours.url}{API}/snapshots/import?name={name}-curl"], check=True)
            results.add(op_curl_import, ours.name, ms_since(start))
            ours.quietly(ours.delete_snapshot, f"{name}-curl")
            exported.unlink(missing_ok=True)
    except Exception as error:  # noqa: BLE001
        log(f"snapshot archives: {error}")
        results.fail(op_export, ours.name, error)
    finally:
        if snap:
            ours.quietly(ours.delete_snapshot, snap)
        if sandbox_id:
            ours.quietly(ours.destroy, sandbox_id)


def throughput(results: Results, mib: int) -> list[tuple[str, str, bool | None]]:
    """Rows of (target, measured, met): export and import each ≥ 70 % of plain tar's MB/s."""
    op_export, op_tar_c, op_import, op_tar_x, op_curl_export, op_curl_import = _ops(mib)
    data = results.facts.get("snapshot archive data bytes", mib * 1048576) / 1e6
    rows = []
    for label, ours_op, tar_op in (("export", op_export, op_tar_c), ("import", op_import, op_tar_x),
                                   ("export (curl)", op_curl_export, op_tar_c),
                                   ("import (curl)", op_curl_import, op_tar_x)):
        o, t = results.get(ours_op, "ours"), results.get(tar_op, "ours")
        target = f"{mib} MiB snapshot archive {label} ≥ 70 % of plain tar"
        if not o.samples or not t.samples:
            rows.append((target, "not measured", None))
            continue
        ours_mbs, tar_mbs = data / (o.median() / 1000), data / (t.median() / 1000)
        pct = ours_mbs / tar_mbs * 100
        rows.append((target, f"ours {ours_mbs:.0f} MB/s, tar {tar_mbs:.0f} MB/s: {pct:.0f} %", pct >= 70))
    return rows
