"""Waits for a server the test scripts started and prints the port it listens on.

usage: await-server.py PID LOG [PORT]

Without PORT the server was told port 0, and its port is the one its ready line names ("... ready
at http://127.0.0.1:PORT ...", in LOG). With PORT (a server that cannot be told port 0), the port
must be held by process PID itself: a port picked before the start can be taken by another
suite's server in between, whose answers would then look like this one's. Either way the server
must answer /healthz with 200 within 120 s, and must not exit meanwhile. Exits non-zero with the
reason otherwise.
"""

import os
import re
import sys
import time
import urllib.request


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def listening_inodes(port: int) -> set:
    """Inodes of the sockets listening on `port` (state 0A in /proc/net/tcp and tcp6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except OSError:
            pass
    return inodes


def holds(pid: int, port: int) -> bool:
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port)}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                return True
        except OSError:
            pass
    return False


def main() -> None:
    pid, log = int(sys.argv[1]), sys.argv[2]
    port = int(sys.argv[3]) if len(sys.argv) > 3 else None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if not alive(pid):
            sys.exit("the server exited before it answered /healthz")
        if port is None:
            try:
                with open(log, errors="replace") as f:
                    found = re.search(r" ready at http://127\.0\.0\.1:(\d+)", f.read())
            except OSError:
                found = None
            if found:
                port = int(found.group(1))
        if port is not None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    if r.status == 200:
                        if not holds(pid, port):
                            sys.exit(f"port {port} answers, but not from the server started "
                                     f"(process {pid}): another server took it")
                        print(port)
                        return
            except OSError:
                pass
        time.sleep(0.1)
    sys.exit("the server did not answer /healthz within 120 s")


main()
