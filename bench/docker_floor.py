"""Docker alone, in the same run: what creating and starting containers costs the daemon itself,
without any server in front of it. These rows are the floor every sandbox server on this machine
stands on: a cold create cannot be faster than one container start, and a fork of N cold replicas
cannot be faster than N parallel starts.

The container has the shape of one of our sandboxes (image, user, read-only root, no
capabilities, no-new-privileges, /tmp tmpfs, limits, private IPC, init, no network — networking
disabled, with a read-only hosts file bound at /etc/hosts, as our server does under runc — a named
volume at /workspace), created and started through the Engine API (the Python `docker` package,
as the reference server uses it), then removed untimed.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid

import docker

from common import Results, log, ms_since

LABEL = {"io.agent-sandbox.bench": "docker-floor"}

# What Docker writes for the `none` network, and what our helper volume carries.
LOOPBACK_HOSTS = (
    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
    "ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n"
)


def _create_start(api: docker.APIClient, image: str, hosts: str) -> tuple[str, str]:
    name = f"bench-floor-{uuid.uuid4().hex[:12]}"
    api.create_volume(name=f"{name}-workspace", labels=LABEL)
    host_config = api.create_host_config(
        network_mode="none",
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        tmpfs={"/tmp": "rw,nosuid,nodev,size=256m"},
        mem_limit=512 * 1048576,
        memswap_limit=512 * 1048576,
        nano_cpus=1_000_000_000,
        pids_limit=256,
        ipc_mode="private",
        init=True,
        mounts=[
            docker.types.Mount("/workspace", f"{name}-workspace", type="volume", no_copy=True),
            docker.types.Mount("/etc/hosts", hosts, type="bind", read_only=True),
        ],
    )
    created = api.create_container(
        image,
        command=["sleep", "3600"],
        name=name,
        user="1000:1000",
        working_dir="/workspace",
        hostname="sandbox",
        labels=LABEL,
        network_disabled=True,
        host_config=host_config,
    )
    api.start(created["Id"])
    return created["Id"], f"{name}-workspace"


def _remove(api: docker.APIClient, made: list[tuple[str, str]]) -> None:
    for container, volume in made:
        try:
            api.remove_container(container, force=True)
            api.remove_volume(volume)
        except docker.errors.APIError as error:
            log(f"docker floor cleanup: {error}")


def floor(results: Results, server: str, image: str, n: int, counts=(1, 5)) -> None:
    """For each count: `count` containers created and started at once (each on its own
    connection), n rounds, counts alternating; timed until the last one runs."""
    clients = [docker.APIClient(version="auto") for _ in range(max(counts))]
    fd, hosts = tempfile.mkstemp(prefix="bench-floor-hosts-")
    with os.fdopen(fd, "w") as file:
        file.write(LOOPBACK_HOSTS)
    os.chmod(hosts, 0o444)
    try:
        for i in range(n):
            for count in counts if i % 2 == 0 else tuple(reversed(counts)):
                op = f"Docker alone: {count} container(s) created and started at once"
                made: list[tuple[str, str]] = []
                errors: list[Exception] = []
                lock = threading.Lock()

                def one(api):
                    try:
                        result = _create_start(api, image, hosts)
                        with lock:
                            made.append(result)
                    except Exception as error:  # noqa: BLE001 - reported below
                        errors.append(error)

                threads = [threading.Thread(target=one, args=(clients[k],)) for k in range(count)]
                start = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                elapsed = ms_since(start)
                if errors:
                    results.fail(op, server, errors[0])
                else:
                    results.add(op, server, elapsed)
                _remove(clients[0], made)
    finally:
        os.unlink(hosts)
        for api in clients:
            api.close()
