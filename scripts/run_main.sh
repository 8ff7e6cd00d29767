#!/usr/bin/env bash
# Set up .venv if needed, then run the main job: the TFX pipeline on MNIST from ../shared/data
# (export -> ExampleGen -> Transform -> Trainer -> RetrievalEvaluator -> Pusher -> IndexBuilder).
# Extra arguments go to `tfhash pipeline run` (e.g. --config another.json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
if [[ $# -eq 0 ]]; then set -- --config pipelines/configs/mnist.json; fi
exec .venv/bin/tfhash pipeline run "$@"
