"""The TFX pipeline: a small real local run (LocalDagRunner, Beam in memory), Kubeflow compile,
and the multi-worker chief logic."""

from __future__ import annotations

import json
import os

import pytest
from tfhash.components import trainer
from tfhash.pipelines.config import PipelineConfig

from tests.pipeline_fixtures import small_config


@pytest.mark.slow
def test_small_pipeline_end_to_end(small_pipeline_run):
    from tfhash.index import load_index

    config, summary = small_pipeline_run
    assert summary["blessed"] is True and summary["metrics"]["queries"] == 400
    assert summary["metrics"]["mAP@all"] > 0.2  # 3 epochs on 400 digits already beat chance (0.1)
    bad = summary["bad_records"]  # the fixture added 3 bad records; policy "drop"
    assert bad["bad_records"] == 3 and bad["policy"] == "drop"
    assert bad["by_split"] == {"train": {"missing label": 1, "unparsable record": 1}, "query": {"unparsable record": 1},
                               "database": {}}  # fmt: skip
    version = summary["model_version"]
    index = load_index(summary["indexes"]["BFlat"], expected_model_version=version)
    assert index.ntotal == 400
    warmup = os.path.join(config.run_dir, "serving", "tiny-mnist", version, "assets.extra", "tf_serving_warmup_requests")
    assert os.path.isfile(warmup)
    assert os.path.isfile(os.path.join(config.run_dir, "summary.json"))
    assert os.path.isfile(os.path.join(summary["tf_serving_config"], "models.config"))
    # the exported signature takes serialized raw examples without labels
    import tensorflow as tf

    loaded = tf.saved_model.load(summary["model_dir"])
    assert set(loaded.signatures) == {"serving_default", "encode_features"}


def test_kubeflow_compile_names_image_and_components(tmp_path):
    from tfhash.pipelines.runner import compile_kubeflow

    config = small_config(tmp_path, image="registry.example/tfhash:1")
    metadata = {"num_classes": 10, "modalities": {"image": {"kind": "image", "shape": [28, 28]}}}
    output = compile_kubeflow(config, str(tmp_path / "pipeline.json"), metadata)
    spec = json.loads(open(output).read())
    text = json.dumps(spec)
    assert "registry.example/tfhash:1" in text
    tasks = spec["pipelineSpec"]["root"]["dag"]["tasks"]
    for component in ("ImportExampleGen", "RecordFilter", "StatisticsGen", "SchemaGen", "Transform", "Trainer",
                      "RetrievalEvaluator", "Pusher", "IndexBuilder", "latest_blessed_model_resolver"):  # fmt: skip
        assert any(name.startswith(component) for name in tasks), component


@pytest.mark.parametrize(
    "tf_config, chief, multi",
    [
        ({}, True, False),
        ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}, True, True),
        ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}, False, True),
        ({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}, False, True),
        ({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}, True, True),
    ],
)
def test_export_only_on_the_chief(monkeypatch, tmp_path, tf_config, chief, multi):
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert trainer.is_chief() is chief and trainer.is_multi_worker() is multi
    target = str(tmp_path / "serving")
    exported = trainer.export_directory(target)
    assert (exported == target) is chief


def test_trainer_targets_carry_label_coefficients():
    import tensorflow as tf

    features = {"labels": tf.ones([2, 3]), "jcch_q": tf.fill([2, 3], 0.5), "jcch_u": tf.fill([2, 3], 2.0)}
    assert trainer.targets(features, False) is features["labels"]
    with_coefficients = trainer.targets(features, True)
    assert set(with_coefficients) == {"labels", "q", "u"}
    assert float(with_coefficients["u"][0, 0]) == 2.0


def test_config_errors_are_clear(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "x", "trainig": {}}))
    with pytest.raises(ValueError, match="unknown settings"):
        PipelineConfig.load(path)
    path.write_text(json.dumps({"name": "x", "training": {"method": "dpsh"}}))
    with pytest.raises(ValueError, match="unknown method"):
        PipelineConfig.load(path)
    path.write_text(json.dumps({"name": "x", "training": {"label_coefficients": True}}))
    with pytest.raises(ValueError, match="jcch_anchors"):
        PipelineConfig.load(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="cannot read"):
        PipelineConfig.load(path)
