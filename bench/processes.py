"""Long-lived processes (`…/sandboxes/{name}/processes`), beside `/v1` exec measured in the same
run on the same sandbox: starting a background process, a keystroke echoed by `cat` through an
attached WebSocket, replaying 8 MiB from offset 0, and the server's CPU while 100 followed
processes print a line a second.

The WebSocket client is a few lines over a plain socket (TCP_NODELAY, masked frames), so that
nothing but the server and the sandbox sits between the keystroke and its echo.
"""

from __future__ import annotations

import base64
import os
import selectors
import socket
import struct
import time
from urllib.parse import urlparse

from common import API, OpError, Results, Server, log, ms_since
from idle import cpu_ticks, rss_mib

OURS = "ours"
REPLAY_BYTES = 8 << 20
FOLLOWED = 100
FOLLOW_WINDOW_S = 30.0


def procs(sb: str) -> str:
    return f"{API}/sandboxes/{sb}/processes"


def start(ours: Server, sb: str, body: dict) -> dict:
    return ours.call("POST", procs(sb), json=body, expect=(201,)).json()


def wait_exited(ours: Server, sb: str, pid: str, timeout: float = 120.0) -> dict:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        p = ours.call("GET", f"{procs(sb)}/{pid}").json()
        if p["state"] != "Running":
            return p
        time.sleep(0.05)
    raise OpError(f"process {pid} still running after {timeout:.0f} s")


class Channels:
    """A client of the attach WebSocket (v5.channel.k8s.io), on a raw socket."""

    def __init__(self, ours: Server, path: str):
        url = urlparse(ours.url)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {ours.key}\r\n"
                f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise OpError("the attach handshake broke off")
            head += chunk
        head, self.buffer = head.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise OpError(f"attach answered {head[:80]!r}")

    def send(self, channel: int, data: bytes) -> None:
        payload = bytes([channel]) + data
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x82]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OpError("the attach socket closed")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def receive(self) -> tuple[int, bytes]:
        """The next binary message as (channel, data); other frames are skipped."""
        while True:
            b0, b1 = self._take(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._take(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._take(8))[0]
            payload = self._take(n)
            if b0 & 0x0F == 0x2 and payload:
                return payload[0], payload[1:]
            if b0 & 0x0F == 0x8:
                raise OpError("the server closed the attach socket")

    def close(self) -> None:
        self.sock.close()


def keystrokes(results: Results, ours: Server, sb: str, n: int) -> None:
    op = "keystroke echoed by cat through an attach WebSocket"
    cat = start(ours, sb, {"argv": ["cat"], "stdin": True})
    ws = Channels(ours, f"{procs(sb)}/{cat['id']}/attach")
    try:
        for i in range(n + 5):
            key = bytes([ord("a") + i % 26])
            t0 = time.perf_counter()
            ws.send(0, key)
            got = b""
            while got != key:
                channel, data = ws.receive()
                if channel == 1:
                    got += data
                if len(got) > 1:
                    raise OpError(f"echo {got!r} for {key!r}")
            if i >= 5:  # the first ones open the stdin session
                results.add(op, OURS, ms_since(t0))
    except Exception as error:  # noqa: BLE001
        results.fail(op, OURS, error)
    finally:
        ws.close()
        ours.quietly(ours.call, "DELETE", f"{procs(sb)}/{cat['id']}")


def replay(results: Results, ours: Server, sb: str, n: int) -> None:
    op = "replay of 8 MiB from offset 0 (base64, byte-exact)"
    p = start(ours, sb, {"command": f"head -c {REPLAY_BYTES} /dev/urandom"})
    done = wait_exited(ours, sb, p["id"])
    if done.get("stdoutBytes") != REPLAY_BYTES:
        results.fail(op, OURS, f"printed {done.get('stdoutBytes')} bytes")
        return
    path = f"{procs(sb)}/{p['id']}/output?stdoutFrom=0&encoding=base64"
    url = urlparse(ours.url)
    buf = bytearray(1 << 20)
    size = 0
    for _ in range(n):
        # HTTP/1.0 on a plain socket, read to its end into one buffer: the time is the server's
        # and the sandbox's, not a Python HTTP client's (httpx added about a fifth here).
        t0 = time.perf_counter()
        try:
            with socket.create_connection((url.hostname, url.port), timeout=60) as s:
                s.sendall(
                    f"GET {path} HTTP/1.0\r\nHost: {url.netloc}\r\n"
                    f"Authorization: Bearer {ours.key}\r\n\r\n".encode()
                )
                first = s.recv(4096)
                if not first.startswith(b"HTTP/1.1 200") and not first.startswith(b"HTTP/1.0 200"):
                    raise OpError(f"output answered {first[:40]!r}")
                size = len(first)
                while (k := s.recv_into(buf)) > 0:
                    size += k
        except Exception as error:  # noqa: BLE001
            results.fail(op, OURS, error)
            continue
        results.add(op, OURS, ms_since(t0))
    results.facts["replay answer bytes (8 MiB as base64 NDJSON, with the head)"] = size


def daemon_pid() -> int | None:
    """dockerd's pid, when it runs on this machine and its /proc entry is readable."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if open(f"/proc/{entry}/comm").read().strip() == "dockerd":
                    cpu_ticks(int(entry))
                    return int(entry)
            except OSError:
                continue
    return None


def followed(results: Results, ours: Server, pid: int, sandboxes: list[str]) -> None:
    """100 processes printing a line a second, each followed by a client of its own: the server's
    CPU (user + system, from /proc) over a window, as % of one core."""
    ids = []
    per = -(-FOLLOWED // len(sandboxes))
    for i in range(FOLLOWED):
        sb = sandboxes[i // per]
        p = start(ours, sb, {"command": "i=0; while true; do echo line $i; i=$((i+1)); sleep 1; done"})
        ids.append((sb, p["id"]))
    url = urlparse(ours.url)
    selector = selectors.DefaultSelector()
    socks = []
    for sb, p in ids:
        s = socket.create_connection((url.hostname, url.port), timeout=30)
        s.sendall(
            f"GET {procs(sb)}/{p}/output?follow=true HTTP/1.0\r\nHost: {url.netloc}\r\n"
            f"Authorization: Bearer {ours.key}\r\n\r\n".encode()
        )
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ)
        socks.append(s)
    received = 0
    closed = 0

    def pump(seconds: float) -> None:
        nonlocal received, closed
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for key, _ in selector.select(timeout=0.2):
                data = key.fileobj.recv(65536)
                if not data:
                    selector.unregister(key.fileobj)
                    closed += 1
                received += len(data)

    try:
        pump(5.0)  # every follower connected and reading
        dockerd = daemon_pid()
        ticks0, t0, rx0 = cpu_ticks(pid), time.perf_counter(), received
        d0 = cpu_ticks(dockerd) if dockerd else 0
        pump(FOLLOW_WINDOW_S)
        ticks1, t1 = cpu_ticks(pid), time.perf_counter()
        d1 = cpu_ticks(dockerd) if dockerd else 0
        hz = os.sysconf("SC_CLK_TCK")
        cpu = (ticks1 - ticks0) / hz / (t1 - t0) * 100.0
        if dockerd:
            results.facts["100 followed processes: dockerd CPU % of one core (context)"] = round(
                (d1 - d0) / hz / (t1 - t0) * 100.0, 2
            )
        results.facts["100 followed processes, a line a second each"] = {
            "server CPU % of one core": round(cpu, 2),
            "window s": round(t1 - t0, 1),
            "bytes received by the followers in the window": received - rx0,
            "followers closed early": closed,
            "server RSS MiB": round(rss_mib(pid), 1),
        }
        log(f"  100 followed: {cpu:.2f} % of one core")
    finally:
        for s in socks:
            s.close()
        for sb, p in ids:
            ours.quietly(ours.call, "DELETE", f"{procs(sb)}/{p}")


def processes(results: Results, ours: Server, pid: int, n: int) -> None:
    samples = max(n, 50)
    sandboxes = [ours.create()["id"] for _ in range(2)]
    sb = sandboxes[0]
    try:
        ours.exec(sb, "true")  # the first exec into a container starts its helper channel
        for i in range(samples):
            # Interleaved, so that load on the machine falls on both alike.
            results.measure("/v1 exec of true (same run)", OURS, ours.exec, sb, "true")
            p = results.measure(
                "start a background process", OURS, start, ours, sb, {"argv": ["sleep", "1"]}
            )
            if p is None:
                continue
        keystrokes(results, ours, sb, samples * 2)
        replay(results, ours, sb, max(n, 20))
        followed(results, ours, pid, sandboxes)
    finally:
        for s in sandboxes:
            ours.quietly(ours.destroy, s)
