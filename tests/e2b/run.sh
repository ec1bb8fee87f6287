#!/usr/bin/env bash
# E2B suite: starts a server on a free local port with a throwaway data directory and key, drives
# it through E2B's published Python SDK (tests/e2b/test_e2b.py, pinned in requirements.txt) with
# only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY pointing it here, then stops the server and
# removes every sandbox container and volume the run created.
#
#   bash tests/e2b/run.sh                  # everything
#   bash tests/e2b/run.sh -- -k files      # anything after -- goes to pytest
#
# Needs Docker, python3 (with venv) and cargo; the test image (with bash, which the SDK runs
# commands with) comes from `scripts/build-test-images.sh --python`. AGENT_SANDBOX_TEST_RUNTIME
# (e.g. runsc) becomes the server's AGENT_SANDBOX_DOCKER_RUNTIME.
set -euo pipefail
cd "$(dirname "$0")/../.."

SUITE=e2b
IMAGE=agent-sandbox-test/python:latest
# shellcheck source=tests/lib/python-suite.sh
source tests/lib/python-suite.sh

suite_args "$@"
suite_prepare
suite_serve AGENT_SANDBOX_ALLOW_NETWORK=true AGENT_SANDBOX_PREVIEW_DOMAIN=preview.localhost
# E2B_TEST_BINARY and E2B_TEST_IMAGE let a test start a server of its own (one it restarts).
suite_pytest \
  E2B_API_URL="http://127.0.0.1:$port/e2b" \
  E2B_SANDBOX_URL="http://127.0.0.1:$port/e2b/envd" \
  E2B_API_KEY="$key" \
  E2B_TEST_SERVER="http://127.0.0.1:$port" \
  E2B_TEST_PREVIEW_DOMAIN=preview.localhost \
  E2B_TEST_BINARY="$BINARY" \
  E2B_TEST_IMAGE="$IMAGE" \
  E2B_TEST_RUNTIME="${AGENT_SANDBOX_TEST_RUNTIME:-}"
