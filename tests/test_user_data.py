"""Your own data: image folders and feature matrices become pipeline input that the
RecordFilter accepts; malformed input is a clear error."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from PIL import Image
from tfhash.components.record_validation import record_problem

from tfhash.cli import main
from tfhash.data import DataFormatError
from tfhash.data.user import load_labels, load_user_dataset


def _records(folder: str) -> list[bytes]:
    files = sorted(glob.glob(os.path.join(folder, "*")))
    return [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]


def _image_tree(root, shape=(6, 5, 3), per_class=4):
    rng = np.random.default_rng(0)
    for name in ("cat", "dog", "eel"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def test_image_folder_export_is_accepted_by_the_record_filter(tmp_path):
    _image_tree(tmp_path / "images")
    result = CliRunner().invoke(main, ["data", "export-user", "--images", str(tmp_path / "images"), "--queries", "3",
                                       "--train", "6", "--output", str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 0, result.output
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert metadata["num_classes"] == 3 and metadata["class_names"] == ["cat", "dog", "eel"]
    assert metadata["modalities"] == {"image": {"kind": "image", "shape": [6, 5, 3]}}
    records = _records(str(tmp_path / "out" / "database"))
    assert len(records) == 9 and len(_records(str(tmp_path / "out" / "query"))) == 3
    assert all(record_problem(r, 3, metadata["modalities"]) is None for r in records)


def test_two_modalities_from_npy_and_csv(tmp_path):
    rng = np.random.default_rng(1)
    np.save(tmp_path / "img.npy", rng.normal(size=(20, 4)).astype(np.float32))
    np.savetxt(tmp_path / "txt.csv", rng.normal(size=(20, 3)), delimiter=",")
    np.savetxt(tmp_path / "labels.csv", (rng.random((20, 5)) < 0.4) | (np.arange(5) == 0), delimiter=",", fmt="%d")
    result = CliRunner().invoke(main, ["data", "export-user", "--features", f"image={tmp_path / 'img.npy'}",
                                       "--features", f"text={tmp_path / 'txt.csv'}", "--labels", str(tmp_path / "labels.csv"),
                                       "--queries", "4", "--train", "10", "--output", str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 0, result.output
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert metadata["modalities"] == {"image": {"kind": "vector", "shape": [4]}, "text": {"kind": "vector", "shape": [3]}}
    assert all(record_problem(r, 5, metadata["modalities"]) is None for r in _records(str(tmp_path / "out" / "train")))


def test_bad_user_data_is_a_clear_error(tmp_path):
    _image_tree(tmp_path / "mixed", shape=(6, 5, 3), per_class=2)
    Image.fromarray(np.zeros((7, 5, 3), np.uint8)).save(tmp_path / "mixed" / "cat" / "odd.png")
    with pytest.raises(DataFormatError, match="different shapes"):
        load_user_dataset(images=str(tmp_path / "mixed"), num_query=1, num_train=2)
    assert load_user_dataset(images=str(tmp_path / "mixed"), image_size=(6, 5), num_query=1, num_train=2).inputs["image"].shape == (7, 6, 5, 3)
    (tmp_path / "mixed" / "dog" / "broken.png").write_bytes(b"not an image")
    with pytest.raises(DataFormatError, match="cannot read the image"):
        load_user_dataset(images=str(tmp_path / "mixed"), image_size=(6, 5), num_query=1, num_train=2)
    np.save(tmp_path / "empty_row.npy", np.array([[1, 0], [0, 0]]))
    with pytest.raises(DataFormatError, match=r"empty_row.npy: .*rows \[1\] \(1 of 2\) have none"):
        load_labels(tmp_path / "empty_row.npy")
    np.save(tmp_path / "fraction.npy", np.array([[1.5], [0]]))
    with pytest.raises(DataFormatError, match="whole numbers"):
        load_labels(tmp_path / "fraction.npy")
    np.save(tmp_path / "a.npy", np.zeros((5, 2), np.float32))
    np.save(tmp_path / "nan.npy", np.full((5, 2), np.nan, np.float32))
    np.save(tmp_path / "ids.npy", np.array([0, 1, 0, 1, 1]))
    np.save(tmp_path / "ids4.npy", np.array([0, 1, 0, 1]))
    with pytest.raises(DataFormatError, match="rows"):
        load_user_dataset({"x": str(tmp_path / "a.npy")}, str(tmp_path / "ids4.npy"), num_query=1, num_train=2)
    with pytest.raises(DataFormatError, match="NaN"):
        load_user_dataset({"x": str(tmp_path / "nan.npy")}, str(tmp_path / "ids.npy"), num_query=1, num_train=2)
    with pytest.raises(ValueError, match="exceed"):
        load_user_dataset({"x": str(tmp_path / "a.npy")}, str(tmp_path / "ids.npy"), num_query=3, num_train=3)
    result = CliRunner().invoke(main, ["data", "export-user", "--features", "nopath", "--labels", str(tmp_path / "ids.npy"),
                                       "--output", str(tmp_path / "o")])  # fmt: skip
    assert result.exit_code == 2 and "NAME=PATH" in result.output


def test_pipeline_config_reads_an_exported_data_dir(tmp_path):
    from tfhash.pipelines.config import PipelineConfig
    from tfhash.pipelines.runner import export_data

    (tmp_path / "config.json").write_text(json.dumps({"name": "mine", "dataset": "custom", "data_dir": "exported"}))
    config = PipelineConfig.load(tmp_path / "config.json")
    assert config.layout.data == str(tmp_path / "exported")
    with pytest.raises(ValueError, match="export-user"):
        export_data(config)
    _image_tree(tmp_path / "images")
    assert CliRunner().invoke(main, ["data", "export-user", "--images", str(tmp_path / "images"), "--queries", "3",
                                     "--train", "6", "--output", str(tmp_path / "exported")]).exit_code == 0  # fmt: skip
    assert export_data(config)["num_classes"] == 3
