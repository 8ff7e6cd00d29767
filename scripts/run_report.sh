#!/usr/bin/env bash
# Set up .venv if needed, then regenerate the evidence report (benchmarks/results/report[_quick].*).
# Arguments go to `python -m benchmarks.report` (e.g. --quick, --seed 0, --only retrieval).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m benchmarks.report "$@"
