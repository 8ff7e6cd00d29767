"""Encoded splits are reused only by a model with the same SavedModel fingerprint."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tensorflow as tf
from tfhash.components import encoding

from tests.serving_fixtures import database, export_version, vector_example


def test_cache_hits_only_for_the_same_model(tmp_path, monkeypatch):
    vectors, _ = database(n=40)
    records = str(tmp_path / "db.tfrecord.gz")
    with tf.io.TFRecordWriter(records, options="GZIP") as writer:
        for i, row in enumerate(vectors):
            writer.write(vector_example(row, label=i % 3, item_id=i))
    first = export_version(str(tmp_path / "models"), 1, seed=0)
    other = export_version(str(tmp_path / "models"), 2, seed=9)
    shutil.copytree(first, tmp_path / "pushed" / "1")  # what the Pusher does
    cache = str(tmp_path / "cache")

    codes, labels, ids = encoding.encode_split_cached(first, [records], 3, cache)
    assert codes.shape == (40, 2) and labels.sum() == 40 and ids.tolist() == list(range(40))

    real_encode = encoding.encode_split
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(encoding, "encode_split", counting)
    again = encoding.encode_split_cached(str(tmp_path / "pushed" / "1"), [records], 3, cache)
    assert calls == []  # the pushed copy has the same fingerprint: read back
    for got, want in zip(again, (codes, labels, ids), strict=True):
        np.testing.assert_array_equal(got, want)
    different = encoding.encode_split_cached(other, [records], 3, cache)
    assert calls == [other]  # another model encodes
    assert not np.array_equal(different[0], codes)
    with pytest.raises(KeyError):
        encoding.encode_split_cached(first, [records], 3, cache, signature="serving_text")
