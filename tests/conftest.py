"""Session fixtures shared by several test modules."""

from __future__ import annotations

import pytest

from tests.pipeline_fixtures import small_config


@pytest.fixture(scope="session")
def small_pipeline_run(tmp_path_factory):
    """One real local run of the MNIST pipeline (LocalDagRunner, Beam in memory): SCDH trained with
    the JCCH coefficients computed by Transform (50 anchors). Returns ``(config, summary)``."""
    from tfhash.pipelines.runner import run_local

    root = tmp_path_factory.mktemp("pipeline")
    config = small_config(root, jcch_anchors=50,
                          training={"method": "scdh", "bits": 16, "epochs": 3, "batch_size": 64, "label_coefficients": True})  # fmt: skip
    return config, run_local(config, log=lambda message: None)
