#!/usr/bin/env bash
# Set up .venv if needed, then run the main job on the real data in ../shared/data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/tfhash quickstart "$@"
