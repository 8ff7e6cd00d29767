"""Dataset loaders against docs/design.md s.5 and the data README (real files in ../shared/data)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from tfhash import data


def _check_split(split, n, n_query, n_train):
    assert split.query.size == n_query
    assert split.database.size == n - n_query
    assert split.train.size == n_train
    assert np.intersect1d(split.query, split.database).size == 0
    assert np.union1d(split.query, split.database).size == n
    assert np.isin(split.train, split.database).all()


def test_mnist_shapes_counts_and_protocol():
    ds = data.load_mnist(seed=3)
    assert ds.inputs["image"].shape == (70000, 28, 28) and ds.inputs["image"].dtype == np.uint8
    assert ds.labels.shape == (70000, 10) and ds.single_label
    # 60,000 + 10,000 images; published per-class counts of MNIST
    counts = np.bincount(ds.class_ids, minlength=10)
    assert counts.tolist() == [6903, 7877, 6990, 7141, 6824, 6313, 6876, 7293, 6825, 6958]
    _check_split(ds.split, 70000, 1000, 5000)
    assert np.bincount(ds.class_ids[ds.split.query]).tolist() == [100] * 10
    assert np.bincount(ds.class_ids[ds.split.train]).tolist() == [500] * 10
    assert ds.split.seed == 3


def test_splits_are_deterministic_and_shuffled():
    labels = np.repeat(np.arange(10), 700)
    a = data.per_class_split(labels, 100, 500, seed=7)
    b = data.per_class_split(labels, 100, 500, seed=7)
    c = data.per_class_split(labels, 100, 500, seed=8)
    np.testing.assert_array_equal(a.database, b.database)
    assert not np.array_equal(a.database, c.database)
    # the database is not stored in label order (docs/design.md s.3)
    assert np.mean(np.diff(labels[a.database]) == 0) < 0.5


def test_cifar10_shapes_counts_and_protocol():
    ds = data.load_cifar10(seed=0)
    assert ds.inputs["image"].shape == (60000, 32, 32, 3) and ds.inputs["image"].dtype == np.uint8
    assert np.bincount(ds.class_ids).tolist() == [6000] * 10
    _check_split(ds.split, 60000, 1000, 5000)
    assert np.bincount(ds.class_ids[ds.split.query]).tolist() == [100] * 10
    assert np.bincount(ds.class_ids[ds.split.train]).tolist() == [500] * 10
    assert 60 < ds.inputs["image"].mean() < 200  # decoded pixels, not zeros


def test_mirflickr_shapes_labels_and_protocol():
    ds = data.load_mirflickr25k(seed=0)
    assert ds.inputs["text"].shape == (20015, 1386)
    assert ds.labels.shape == (20015, 24)
    per_row = ds.labels.sum(axis=1)
    assert per_row.min() >= 1 and 3.0 < per_row.mean() < 4.5  # README: 3.8 labels on average
    assert not ds.single_label
    _check_split(ds.split, 20015, 2000, 10000)


def test_wiki_shapes_and_protocol():
    ds = data.load_wiki(seed=0)
    assert ds.inputs["image"].shape == (2866, 128) and ds.inputs["text"].shape == (2866, 10)
    assert ds.single_label and ds.num_classes == 10
    assert ds.split.query.size == 693 and ds.split.database.size == 2173
    np.testing.assert_array_equal(np.sort(ds.split.train), np.arange(2173))
    np.testing.assert_array_equal(ds.split.query, np.arange(2173, 2866))


def test_missing_file_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv(data.ENV_VAR, str(tmp_path / "elsewhere"))
    with pytest.raises(data.DataNotFoundError, match="elsewhere") as err:
        data.load_mnist()
    assert "TFHASH_DATA_ROOT" in str(err.value)


def test_data_root_argument_wins_over_environment(tmp_path, monkeypatch):
    real_root = data.find_data_file("wiki/wiki_data.mat").parents[1]
    monkeypatch.setenv(data.ENV_VAR, "/definitely/not/here")
    ds = data.load_wiki(data_root=real_root)
    assert ds.name == "wiki"


def test_corrupt_idx_file_is_a_clear_error(tmp_path):
    (tmp_path / "mnist").mkdir()
    for name in data.mnist.FILES.values():
        with gzip.open(tmp_path / name, "wb") as handle:
            handle.write(b"\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x1c\x00\x00\x00\x1c" + b"\x00" * 10)
    with pytest.raises(data.DataFormatError, match="header promises"):
        data.load_mnist(data_root=tmp_path)
    (tmp_path / data.mnist.FILES["train_images"]).write_bytes(b"not gzip")
    with pytest.raises(data.DataFormatError, match="cannot read"):
        data.load_mnist(data_root=tmp_path)


def test_corrupt_mat_and_archive_are_clear_errors(tmp_path):
    for rel in ("mirflickr25k/mirflickr25k-yall.mat", "mirflickr25k/mirflickr25k-lall.mat",
                "wiki/wiki_data.mat", "cifar10/cifar10-jpg.tar.gz"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(b"garbage")
    with pytest.raises(data.DataFormatError):
        data.load_mirflickr25k(data_root=tmp_path)
    with pytest.raises(data.DataFormatError):
        data.load_wiki(data_root=tmp_path)
    with pytest.raises(data.DataFormatError):
        data.load_cifar10(data_root=tmp_path)


def test_unknown_dataset_name():
    with pytest.raises(ValueError, match="choose one of"):
        data.load_dataset("imagenet")


def test_export_tfrecords_round_trip(tmp_path):
    import tensorflow as tf

    from tfhash.data.export import export_tfrecords

    ds = data.load_wiki(seed=0)
    meta = export_tfrecords(ds, tmp_path, shards=2, limit=50)
    assert meta["split"]["train"] == 50 and meta["modalities"]["text"] == {"kind": "vector", "shape": [10]}
    files = sorted(str(p) for p in (tmp_path / "query").glob("*.tfrecord.gz"))
    assert len(files) == 2
    spec = {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "labels": tf.io.VarLenFeature(tf.int64),
        "image": tf.io.FixedLenFeature([128], tf.float32),
        "text": tf.io.FixedLenFeature([10], tf.float32),
    }
    rows = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    assert len(rows) == 50
    by_id = {int(r["id"]): r for r in rows}
    first = int(ds.split.query[0])
    np.testing.assert_allclose(by_id[first]["text"].numpy(), ds.inputs["text"][first])
    assert tf.sparse.to_dense(by_id[first]["labels"]).numpy().tolist() == np.flatnonzero(ds.labels[first]).tolist()


def test_export_images_as_png(tmp_path):
    import tensorflow as tf

    from tfhash.data.export import to_example

    image = np.arange(28 * 28, dtype=np.uint8).reshape(28, 28)
    example = to_example({"image": image}, np.array([0, 1, 1]), 7)
    png = example.features.feature["image"].bytes_list.value[0]
    np.testing.assert_array_equal(tf.io.decode_png(png).numpy()[..., 0], image)
    assert list(example.features.feature["labels"].int64_list.value) == [1, 2]
    with pytest.raises(ValueError, match="NaN"):
        to_example({"x": np.array([np.nan, 1.0], dtype=np.float32)}, np.array([1]), 0)
