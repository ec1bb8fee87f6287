"""Starts the reference server (agent-sandbox 0.2.1) for the benchmark.

On startup the reference removes every labeled sandbox container and volume on the daemon that its
data directory does not know, which would take down the sandboxes of any other server sharing the
daemon. The benchmark gives it a fresh data directory, so that sweep has nothing of its own to find;
it is turned off here and nothing else is changed. Arguments are those of `agent-sandbox`.
"""

import sys

from agent_sandbox.backends import docker as docker_backend
from agent_sandbox.cli import main


def _no_foreign_ids(self):  # noqa: ARG001 - signature of DockerBackend.list_ids
    return []


docker_backend.DockerBackend.list_ids = _no_foreign_ids

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
