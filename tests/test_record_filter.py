"""The bad-record policy: each kind of bad record is named, counted and dropped or refused."""

from __future__ import annotations

import io
import os

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.options.pipeline_options import PipelineOptions
from PIL import Image
from tfhash.components.record_filter import apply_policy, filter_records, read_counts
from tfhash.components.record_validation import record_problem

MODALITIES = {"image": {"kind": "image", "shape": [4, 4]}, "vec": {"kind": "vector", "shape": [3]}}


def _png(shape) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.zeros(shape, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def make_record(labels=(1,), image=None, vec=(0.0, 1.0, 2.0), example_id=7, drop=()) -> bytes:
    feature = {
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[example_id])),
        "labels": tf.train.Feature(int64_list=tf.train.Int64List(value=list(labels))),
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_png((4, 4)) if image is None else image])),
        "vec": tf.train.Feature(float_list=tf.train.FloatList(value=list(vec))),
    }
    for name in drop:
        del feature[name]
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


BAD = {
    "unparsable record": b"\xff\xfe not a proto",
    "missing id": make_record(drop=("id",)),
    "missing label": make_record(labels=()),
    "label out of range": make_record(labels=(3,)),
    "missing feature": make_record(drop=("vec",)),
    "wrong feature length": make_record(vec=(1.0, 2.0)),
    "non-finite feature": make_record(vec=(1.0, float("nan"), 2.0)),
    "undecodable image": make_record(image=b"\x89PNG broken"),
    "wrong image shape": make_record(image=_png((5, 4))),
}


def test_each_bad_record_is_named():
    assert record_problem(make_record(labels=(0, 2)), 3, MODALITIES) is None
    for reason, record in BAD.items():
        assert record_problem(record, 3, MODALITIES) == reason


def _write(path, records):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for record in records:
            writer.write(record)


@pytest.mark.beam
def test_filter_drops_and_counts_with_real_beam(tmp_path):
    good = [make_record(example_id=i) for i in range(5)]
    _write(str(tmp_path / "in" / "Split-train" / "data.gz"), good[:3] + [BAD["missing label"], BAD["undecodable image"]])
    _write(str(tmp_path / "in" / "Split-query" / "data.gz"), good[3:] + [BAD["wrong feature length"]])
    options = PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1"])
    with beam.Pipeline(options=options) as pipeline:
        filter_records(pipeline, str(tmp_path / "in"), str(tmp_path / "out"), ["train", "query"], 3, MODALITIES,
                       str(tmp_path / "report"))  # fmt: skip
    report = read_counts(str(tmp_path / "report"), ["train", "query"])
    assert report["bad_records"] == 3
    assert report["by_split"] == {"train": {"missing label": 1, "undecodable image": 1}, "query": {"wrong feature length": 1}}
    kept = {split: [r.numpy() for r in tf.data.TFRecordDataset(tf.io.gfile.glob(str(tmp_path / "out" / f"Split-{split}" / "*")),
                                                               compression_type="GZIP")] for split in ("train", "query")}  # fmt: skip
    assert sorted(kept["train"]) == sorted(good[:3]) and sorted(kept["query"]) == sorted(good[3:])
    apply_policy(report, "drop")
    with pytest.raises(ValueError, match="3 bad records"):
        apply_policy(report, "fail")
    apply_policy(read_counts(str(tmp_path / "nothing"), ["train"]), "fail")  # clean data passes
