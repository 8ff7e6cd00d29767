"""Your own data: image folders and feature matrices become pipeline input that the
RecordFilter accepts; malformed input is a clear error."""

from __future__ import annotations

import base64
import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner
from PIL import Image
from tfhash.components.record_validation import record_problem

from tfhash.artifacts import ITEMS_FILE, read_items
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
    with pytest.raises(DataFormatError, match=r"images of 2 sizes.*6x5 \(6 images\), 7x5 \(1 image\); pass --image-size 6 5"):
        load_user_dataset(images=str(tmp_path / "mixed"), num_query=1, num_train=2)
    assert load_user_dataset(images=str(tmp_path / "mixed"), image_size=(6, 5), num_query=1, num_train=2).inputs["image"].shape == (7, 6, 5, 3)
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
    with pytest.raises(ValueError, match="3 queries \\+ 3 train exceed the 5 items.*use e.g. --queries 1 --train 4"):
        load_user_dataset({"x": str(tmp_path / "a.npy")}, str(tmp_path / "ids.npy"), num_query=3, num_train=3)
    result = CliRunner().invoke(main, ["data", "export-user", "--features", "nopath", "--labels", str(tmp_path / "ids.npy"),
                                       "--output", str(tmp_path / "o")])  # fmt: skip
    assert result.exit_code == 2 and "NAME=PATH" in result.output


def test_pipeline_config_reads_an_exported_data_dir(tmp_path):
    from tfhash.pipelines.config import PipelineConfig
    from tfhash.pipelines.runner import export_data

    (tmp_path / "config.json").write_text(json.dumps({"name": "mine", "data_dir": "exported"}))
    with pytest.raises(ValueError, match=r"config.json: data_dir .*exported' holds no metadata.json: write the folder with `tfhash data export-user`"):
        PipelineConfig.load(tmp_path / "config.json")  # found when the config is read, not minutes into the run
    _image_tree(tmp_path / "images")
    assert CliRunner().invoke(main, ["data", "export-user", "--images", str(tmp_path / "images"), "--queries", "3",
                                     "--train", "6", "--output", str(tmp_path / "exported")]).exit_code == 0  # fmt: skip
    config = PipelineConfig.load(tmp_path / "config.json")
    assert config.layout.data == str(tmp_path / "exported")
    assert export_data(config)["num_classes"] == 3
    (tmp_path / "both.json").write_text(json.dumps({"name": "mine", "dataset": "myphotos", "data_dir": "exported"}))
    with pytest.raises(ValueError, match="both.json: dataset 'myphotos' and data_dir are both set"):
        PipelineConfig.load(tmp_path / "both.json")


def _save(path, image: Image.Image):
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def test_a_messy_photo_folder_exports_with_every_change_recorded(tmp_path):
    """Colour, greyscale, palette and transparent images of several sizes, nested folders, stray
    files and two corrupt images: one error lists both corrupt files; --skip-bad exports the
    rest as RGB at the size asked, and metadata.json / items.csv say what happened to which file."""
    rng = np.random.default_rng(3)
    photos = tmp_path / "photos"
    for name in ("cat", "dog"):
        for i in range(6):
            _save(photos / name / f"{i}.jpg", Image.fromarray(rng.integers(0, 255, (12, 10, 3), dtype=np.uint8)))
    _save(photos / "cat" / "grey.png", Image.fromarray(rng.integers(0, 255, (12, 10), dtype=np.uint8)))
    _save(photos / "dog" / "2019" / "palette.gif", Image.fromarray(rng.integers(0, 255, (20, 16, 3), dtype=np.uint8)).convert("P"))
    _save(photos / "dog" / "clear.png", Image.new("RGBA", (10, 12), (0, 0, 0, 0)))
    (photos / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    (photos / "dog" / "truncated.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (photos / "cat" / "notes.txt").write_text("not an image")
    (photos / "cat" / ".DS_Store").write_bytes(b"\0")
    export = ["data", "export-user", "--images", str(photos), "--output", str(tmp_path / "out")]
    refused = CliRunner().invoke(main, export)
    assert refused.exit_code == 2 and "2 file(s) cannot be read" in refused.output
    assert "cat/broken.jpg" in refused.output and "dog/truncated.png" in refused.output and "--skip-bad" in refused.output
    sizes = CliRunner().invoke(main, [*export, "--skip-bad"])
    assert sizes.exit_code == 2 and "pass --image-size 12 10" in sizes.output
    done = CliRunner().invoke(main, [*export, "--skip-bad", "--image-size", "12", "10"])
    assert done.exit_code == 0, done.output
    metadata = json.loads((tmp_path / "out" / "metadata.json").read_text())
    notes = metadata["notes"]["images"]
    assert notes["colour"] == "RGB" and notes["size"] == [12, 10] and notes["resized"] == 1
    assert notes["converted"] == {"L to RGB": 1, "P to RGB": 1, "RGBA to RGB": 1}
    assert sorted(s["path"] for s in notes["skipped"]) == ["cat/broken.jpg", "dog/truncated.png"]
    assert notes["not images"] == {"count": 1, "examples": ["cat/notes.txt"]}
    assert metadata["modalities"] == {"image": {"kind": "image", "shape": [12, 10, 3]}}
    assert metadata["split"]["query"] == 1 and metadata["split"]["train"] == 14  # defaults that fit 15 images
    items = read_items(tmp_path / "out" / ITEMS_FILE)
    assert len(items) == 15 and sorted(item.path for item in items.values())[:2] == ["cat/0.jpg", "cat/1.jpg"]
    assert items[next(i for i, item in items.items() if item.path == "dog/2019/palette.gif")].labels == ("dog",)
    white = load_user_dataset(images=str(photos), image_size=(12, 10), skip_bad=True)
    clear = white.extra["paths"].index("dog/clear.png")
    assert (white.inputs["image"][clear] == 255).all()  # transparency laid on white


def test_greyscale_folders_stay_greyscale_and_lists_and_csv_names_are_read(tmp_path):
    rng = np.random.default_rng(4)
    for name in ("a", "b"):
        for i in range(3):
            _save(tmp_path / "grey" / name / f"{i}.png", Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)))
    grey = load_user_dataset(images=str(tmp_path / "grey"))
    assert grey.inputs["image"].shape == (6, 8, 8) and grey.extra["notes"]["images"]["colour"] == "grey"
    (tmp_path / "grey" / "list.csv").write_text("path,labels\na/0.png,cat\nb/1.png,dog;pet\na/2.png,cat\n")
    listed = load_user_dataset(images=str(tmp_path / "grey" / "list.csv"), num_query=1, num_train=2)
    assert listed.class_names == ["cat", "dog", "pet"] and listed.labels.tolist() == [[1, 0, 0], [0, 1, 1], [1, 0, 0]]
    assert listed.extra["paths"] == ["a/0.png", "b/1.png", "a/2.png"]
    (tmp_path / "grey" / "gone.csv").write_text("a/0.png,cat\na/missing.png,dog\n")
    with pytest.raises(DataFormatError, match=r"1 file\(s\) cannot be read as images: a/missing.png \(.*No such file"):
        load_user_dataset(images=str(tmp_path / "grey" / "gone.csv"), num_query=1, num_train=1)
    (tmp_path / "features.csv").write_text("f1,f2\n" + "\n".join(f"{i},{i * 2}" for i in range(6)))
    (tmp_path / "names.csv").write_text("label\n" + "\n".join(["cat", "dog", "cat", "eel", "dog", "cat"]))
    named = load_user_dataset({"x": str(tmp_path / "features.csv")}, str(tmp_path / "names.csv"))
    assert named.inputs["x"].shape == (6, 2) and named.class_names == ["cat", "dog", "eel"]
    assert named.labels.argmax(axis=1).tolist() == [0, 1, 0, 2, 1, 0]
    (tmp_path / "tags.csv").write_text("cat,dog\n1,0\n0,1\n1,1\n1,0\n0,1\n1,0\n")
    assert load_user_dataset({"x": str(tmp_path / "features.csv")}, str(tmp_path / "tags.csv")).class_names == ["cat", "dog"]


def test_a_query_image_is_prepared_as_the_folder_was(tmp_path):
    rng = np.random.default_rng(5)
    for name in ("a", "b"):
        for i in range(3):
            _save(tmp_path / "photos" / name / f"{i}.png", Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)))
    assert CliRunner().invoke(main, ["data", "export-user", "--images", str(tmp_path / "photos"), "--output",
                                     str(tmp_path / "out")]).exit_code == 0  # fmt: skip
    _save(tmp_path / "query.png", Image.fromarray(rng.integers(0, 255, (30, 20), dtype=np.uint8)))  # grey, another size
    result = CliRunner().invoke(main, ["data", "image-query", str(tmp_path / "query.png"), "--data-dir", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    record = base64.b64decode(result.output.strip())
    image = tf.io.decode_png(tf.train.Example.FromString(record).features.feature["image"].bytes_list.value[0])
    assert tuple(image.shape) == (8, 8, 3)
