"""Session fixtures shared by several test modules, and one scratch folder for the session.

Beam's stager, TFX's module packaging and Milvus Lite's logs write into the temporary folder and
leave their files there; the session points ``TMPDIR`` (inherited by every subprocess and Beam
worker) at a folder of its own and removes it when every test passed (a failed run keeps it and
says where)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.pipeline_fixtures import small_config

_SCRATCH = {}


def pytest_configure(config):
    _SCRATCH["path"] = tempfile.mkdtemp(prefix="tfhash-tests-")
    _SCRATCH["previous"] = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = _SCRATCH["path"]
    tempfile.tempdir = None  # read TMPDIR again


def pytest_sessionfinish(session, exitstatus):
    _SCRATCH["passed"] = exitstatus == 0


def pytest_unconfigure(config):
    path = _SCRATCH.pop("path", None)
    if path is None:
        return
    previous = _SCRATCH.pop("previous")
    if previous is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous
    tempfile.tempdir = None
    if _SCRATCH.pop("passed", False):
        shutil.rmtree(path, ignore_errors=True)
    else:
        print(f"\ntest scratch kept at {path}")


@pytest.fixture(scope="session")
def small_pipeline_run(tmp_path_factory):
    """One real local run of the MNIST pipeline (LocalDagRunner, Beam in memory): SCDH trained with
    the JCCH coefficients computed by Transform (50 anchors), on exported data with three bad
    records added (policy "drop"), indexed by BFlat and by Milvus (the run's Milvus Lite file).
    Returns ``(config, summary)``."""
    import tensorflow as tf
    from tfhash.pipelines.runner import export_data, run_local

    from tfhash.cli import write_serving_config

    root = tmp_path_factory.mktemp("pipeline")
    config = small_config(root, jcch_anchors=50, bad_records="drop", index_kinds=["BFlat", "Milvus"],
                          training={"method": "scdh", "bits": 16, "epochs": 3, "batch_size": 64, "label_coefficients": True})  # fmt: skip
    export_data(config, log=lambda message: None)
    image = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"not a png"]))
    no_label = tf.train.Example(features=tf.train.Features(feature={
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[10**6])), "image": image}))  # fmt: skip
    for split, records in {"train": [no_label.SerializeToString(), b"garbage"], "query": [b"\xff\xfe not a proto"]}.items():
        with tf.io.TFRecordWriter(f"{config.layout.data}/{split}/zz-bad.tfrecord.gz", options="GZIP") as writer:
            for record in records:
                writer.write(record)
    return config, run_local(config, log=lambda message: None, after_push=write_serving_config)
