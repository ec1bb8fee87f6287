#!/usr/bin/env bash
# MCP suite: starts a server on a free local port with a throwaway data directory and key, then
# drives `agent-sandbox mcp` (stdio) with the official Python MCP client (tests/mcp/test_mcp.py),
# then stops the server and removes every sandbox container and volume the run created.
#
#   bash tests/mcp/run.sh                  # everything
#   bash tests/mcp/run.sh -- -k rollback   # anything after -- goes to pytest
#
# Needs Docker, python3 (with venv) and cargo; the test image comes from
# scripts/build-test-images.sh. AGENT_SANDBOX_TEST_RUNTIME (e.g. runsc) becomes the server's
# AGENT_SANDBOX_DOCKER_RUNTIME. Python is needed only by this client test: the MCP server itself
# is the agent-sandbox binary.
set -euo pipefail
cd "$(dirname "$0")/../.."

SUITE=mcp
IMAGE=agent-sandbox-test/busybox:latest
# shellcheck source=tests/lib/python-suite.sh
source tests/lib/python-suite.sh

suite_args "$@"
suite_prepare
suite_serve
suite_pytest \
  AGENT_SANDBOX_URL="http://127.0.0.1:$port" \
  AGENT_SANDBOX_API_KEY="$key" \
  MCP_TEST_BINARY="$BINARY" \
  MCP_TEST_DEFAULT_IMAGE="$IMAGE"
