#!/usr/bin/env bash
# Set up .venv if needed, then run the tests.
#
#   bash scripts/run_tests.sh              the whole suite (what CI runs)
#   bash scripts/run_tests.sh --fast       the fast tier: the tests that start no process, no server
#                                          and no Beam job (tests/tiers.py); after each change
#   bash scripts/run_tests.sh --coverage   the whole suite under coverage.py, the processes it starts
#                                          included: coverage.json and a report per file
#
# --fast and --coverage combine; other arguments go to pytest. The tests run on two pytest-xdist
# workers, each test file whole on one (tests/workers.py); TFHASH_TEST_WORKERS sets how many (0: in
# this process). An empty selection (pytest exit code 5) is reported, and is an error only when no
# selection was asked for (then the suite is missing).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh || exit 1
# The search page's browser tests drive Debian's headless Chromium: installed here where it is
# missing and this runs as root with apt-get (elsewhere those tests say they are skipped).
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "run_tests: installing chromium and chromium-driver for the browser tests"
    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; } >/dev/null 2>&1 \
      || echo "run_tests: could not install chromium; the browser tests will be skipped" >&2
  fi
fi

# A full run peaks at 2.2 GB in its scratch folder under TMPDIR (tests/conftest.py).
source scripts/free_space.sh
require_free_gb run_tests "${TMPDIR:-/tmp}" 3 "the test run's scratch folder" || exit 1

coverage=0
selection=()
for arg in "$@"; do
  case "$arg" in
    --coverage) coverage=1 ;;
    *) selection+=("$arg") ;;
  esac
done
args=()
workers="${TFHASH_TEST_WORKERS:-2}"
if [[ "$workers" != 0 ]]; then args+=(-n "$workers" --dist loadfile --no-loadscope-reorder); fi
args+=("${selection[@]}")

if [[ $coverage -eq 1 ]]; then
  .venv/bin/python -m coverage erase
  .venv/bin/python -m coverage run -m pytest "${args[@]}"
else
  .venv/bin/python -m pytest "${args[@]}"
fi
status=$?
if [[ $coverage -eq 1 ]]; then
  .venv/bin/python -m coverage combine -q && .venv/bin/python -m coverage json -q -o coverage.json \
    && .venv/bin/python -m coverage report --format=total >/dev/null \
    && echo "run_tests: coverage of the whole run in coverage.json ($(.venv/bin/python -m coverage report --format=total)% of lines and branches)" \
    || { echo "run_tests: combining the coverage data failed" >&2; [[ $status -eq 0 ]] && status=1; }
fi
if [[ $status -eq 5 ]]; then
  echo "run_tests: pytest collected no tests" >&2
  if [[ ${#selection[@]} -gt 0 ]]; then exit 0; fi
fi
exit $status
