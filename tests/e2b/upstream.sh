#!/usr/bin/env bash
# E2B's own Python SDK tests against this server: given a checkout of E2B's repository (its
# packages/python-sdk directory, or that directory's tests/), starts a server on a free local port
# with a throwaway data directory and key, runs E2B's tests with the pinned SDK
# (tests/e2b/upstream-requirements.txt) pointed here by E2B_API_URL, E2B_SANDBOX_URL and
# E2B_API_KEY only, and prints the counts; then stops the server and removes every sandbox
# container and volume the run created. Not part of CI (it needs E2B's repository, which CI does
# not fetch); docs/e2b.md has the last run's figures and what the failures are.
#
#   bash tests/e2b/upstream.sh PATH/TO/E2B/packages/python-sdk
#   bash tests/e2b/upstream.sh PATH -- -k files    # anything after -- goes to pytest
#
# Selection and counts: tests/e2b/upstream_plugin.py (the groups excluded and why). Nothing is
# written into the checkout. UPSTREAM_WORKERS (default 3) sets pytest-xdist's worker count. The
# server's default sandbox timeout is E2B's (300 s); the image is the Python test image, with
# its network on (AGENT_SANDBOX_ALLOW_NETWORK, as tests/e2b/run.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  [ $# -ge 1 ] && exit 0 || exit 2
fi
checkout=$1
shift
[ "$(basename "$checkout")" = tests ] && checkout=$(dirname "$checkout")
if [ ! -f "$checkout/pytest.ini" ] || [ ! -d "$checkout/tests" ]; then
  echo "[e2b-upstream] $checkout is not E2B's python-sdk directory (no pytest.ini and tests/)" >&2
  exit 2
fi
checkout=$(cd "$checkout" && pwd)

SUITE=e2b-upstream
IMAGE=agent-sandbox-test/python:latest
REQUIREMENTS=tests/e2b/upstream-requirements.txt
# shellcheck source=tests/lib/python-suite.sh
source tests/lib/python-suite.sh

suite_args "$@"
suite_prepare
suite_serve AGENT_SANDBOX_ALLOW_NETWORK=true AGENT_SANDBOX_DEFAULT_TIMEOUT_SECONDS=300
ours=$(pwd)/tests/e2b
# pytest runs from the checkout: the venv's python by its absolute path.
[[ "$PYTHON" = /* ]] || PYTHON="$(pwd)/$PYTHON"
status=0
(
  cd "$checkout"
  env "${unset_env[@]}" \
    E2B_API_URL="http://127.0.0.1:$port/e2b" \
    E2B_SANDBOX_URL="http://127.0.0.1:$port/e2b/envd" \
    E2B_API_KEY="$key" \
    PYTHONPATH="$ours" PYTHONDONTWRITEBYTECODE=1 \
    "$PYTHON" -m pytest -p no:cacheprovider -p upstream_plugin --rootdir "$checkout" \
    --continue-on-collection-errors -n "${UPSTREAM_WORKERS:-3}" -q tests "${pytest_args[@]}"
) || status=$?
# Failing tests (status 1) are the figures here, not a failure of the script; a run that could
# not happen (interrupted, an internal or usage error, nothing collected) is.
if [ "$status" -ge 2 ]; then
  say "pytest could not run (status $status); the server's log is kept in $TARGET_DIR/$SUITE-server.log"
  exit "$status"
fi
exit 0
