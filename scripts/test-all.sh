#!/usr/bin/env bash
# Runs the whole test suite: unit and in-process tests, integration tests against the real Docker
# daemon (under runc, and under gVisor's runsc when it is registered), the compatibility suite that
# drives the server through the published Python SDK, E2B's published Python SDK against the E2B
# API, the MCP server through an MCP client, and a property-based fuzz run of the HTTP API from its
# own OpenAPI document.
#
# Needs: a running Docker daemon, cargo, python3, debootstrap. Builds the offline test images itself.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# The in-sandbox helper is part of what is tested: a build without it must fail, not fall back.
export AGENT_SANDBOX_REQUIRE_HELPER=1

# The Python image too (debootstrap from Debian's mirror): the tests that need Python or bash
# (a REPL keeping state, a bash fork bomb, a thread storm) must run here, so a missing image
# fails them instead of skipping them.
step "test images"
bash scripts/build-test-images.sh --python
export AGENT_SANDBOX_REQUIRE_PYTHON_IMAGE=1

step "build"
cargo build --all-targets --locked

step "cargo test (runc)"
cargo test --locked --no-fail-fast -- --test-threads="${TEST_THREADS:-4}"

step "the in-sandbox helper's own tests"
cargo test --locked --manifest-path helper/Cargo.toml -- --test-threads="${TEST_THREADS:-4}"

step "Python SDK compatibility suite"
bash tests/sdk/run.sh

step "MCP server, driven by the Python MCP client"
bash tests/mcp/run.sh

step "E2B compatibility, driven by E2B's published Python SDK"
bash tests/e2b/run.sh

# About half a minute on 2 cores (~300 cases over every operation, then the stateful walk);
# bounded by the per-operation example count and a hard timeout, and fails on any failure.
# Under runc only: it checks the document against the handlers, which the runtime does not change
# (under runsc the same run passes and takes about three times as long).
step "API fuzzing from the OpenAPI document (schemathesis)"
timeout 600 bash tests/fuzz/run.sh

if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
  step "integration tests under gVisor (runsc)"
  AGENT_SANDBOX_TEST_RUNTIME=runsc cargo test --locked --no-fail-fast --tests -- --test-threads="${TEST_THREADS:-4}"
  step "Python SDK compatibility suite under gVisor (runsc)"
  AGENT_SANDBOX_TEST_RUNTIME=runsc bash tests/sdk/run.sh
  step "E2B compatibility suite under gVisor (runsc)"
  AGENT_SANDBOX_TEST_RUNTIME=runsc bash tests/e2b/run.sh
else
  echo "runsc is not registered with docker: skipping the gVisor pass (scripts/install-runsc.sh adds it)"
fi

# Last, and alone: nothing else may be using the daemon while it restarts.
step "Docker daemon restart under a running server"
AGENT_SANDBOX_TEST_DOCKER_RESTART=1 cargo test --locked --test crash_safety -- --ignored --exact \
  docker_daemon_restart_under_a_running_server
docker info > /dev/null
AGENT_SANDBOX_TEST_DOCKER_RESTART=1 cargo test --locked --test pause_resume -- --ignored --exact \
  pause_and_stop_survive_a_docker_daemon_restart
docker info > /dev/null
if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; then
  # Under gVisor a paused container can come out of the restart unstartable: it is replaced.
  AGENT_SANDBOX_TEST_RUNTIME=runsc AGENT_SANDBOX_TEST_DOCKER_RESTART=1 cargo test --locked \
    --test pause_resume -- --ignored --exact pause_and_stop_survive_a_docker_daemon_restart
  docker info > /dev/null
fi
