"""The small real pipeline run that the pipeline and serving integration tests share."""

from __future__ import annotations

import json

from tfhash.pipelines.config import PipelineConfig


def small_config(tmp_path, **overrides) -> PipelineConfig:
    """400 MNIST examples per split, 16-bit SCDH, 3 epochs, written as a config file and loaded."""
    raw = {
        "name": "tiny-mnist",
        "dataset": "mnist",
        "limit": 400,
        "run_dir": str(tmp_path / "run"),
        "training": {"method": "scdh", "bits": 16, "epochs": 3, "batch_size": 64},
        "map_threshold": 0.2,
        **overrides,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return PipelineConfig.load(path)
