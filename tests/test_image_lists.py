"""NUS-WIDE and MS-COCO loaders on small sets written here in the distributed formats."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from tfhash.data import DataFormatError, load_coco, load_nuswide, per_tag_split


def write_images(root, paths, seed: int = 0, size=(20, 24)) -> None:
    rng = np.random.default_rng(seed)
    for path in paths:
        file = root / path
        file.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(file, format="JPEG" if path.endswith(".jpg") else "PNG")


def nuswide_copy(tmp_path, n: int = 130, concepts: int = 5, seed: int = 0):
    """A NUS-WIDE-shaped copy: Windows paths in the image list, Groundtruth/AllLabels files, one
    rare concept (to be dropped) and some images without any frequent concept."""
    rng = np.random.default_rng(seed)
    labels = (rng.random((n, concepts)) < 0.45).astype(np.uint8)
    labels[:, 0] = 0
    labels[:3, 0] = 1  # the rare concept
    labels[3:6] = 0  # rows without any label
    names = [f"c{i}" for i in range(concepts)]
    paths = [f"{names[i % concepts]}/{i:04d}_{i * 7}.jpg" for i in range(n)]
    write_images(tmp_path / "images", paths, seed)
    (tmp_path / "ImageList.txt").write_text("\n".join("C:\\ImageData\\Flickr\\" + p.replace("/", "\\") for p in paths) + "\n")
    truth = tmp_path / "Groundtruth" / "AllLabels"
    truth.mkdir(parents=True)
    for c, name in enumerate(names):
        (truth / f"Labels_{name}.txt").write_text("\n".join(str(v) for v in labels[:, c]) + "\n")
    return labels, names


def test_nuswide_protocol(tmp_path):
    labels, names = nuswide_copy(tmp_path)
    ds = load_nuswide(tmp_path / "images", tmp_path / "ImageList.txt", tmp_path / "Groundtruth" / "AllLabels",
                      image_size=(16, 16), concepts=4, queries_per_tag=3, train_per_tag=5)  # fmt: skip
    assert ds.class_names == names[1:]  # the 4 most frequent concepts, in their original order
    kept = labels[:, 1:].sum(axis=1) > 0
    assert ds.labels.shape == (int(kept.sum()), 4) and ds.labels.sum(axis=1).min() >= 1
    np.testing.assert_array_equal(ds.extra["kept_rows"], np.flatnonzero(kept))
    np.testing.assert_array_equal(ds.labels, labels[kept][:, 1:])
    assert ds.inputs["image"].shape == (int(kept.sum()), 16, 16, 3) and ds.inputs["image"].dtype == np.uint8
    split = ds.split
    assert split.query.size == 12 and split.train.size == 20
    assert not set(split.query) & set(split.database) and set(split.train) <= set(split.database)
    assert set(split.query) | set(split.database) == set(range(ds.labels.shape[0]))
    for tag in range(4):  # each tag contributes its quota of queries and training images
        assert ds.labels[split.query, tag].sum() >= 3 and ds.labels[split.train, tag].sum() >= 5
    again = load_nuswide(tmp_path / "images", tmp_path / "ImageList.txt", tmp_path / "Groundtruth" / "AllLabels",
                         image_size=(16, 16), concepts=4, queries_per_tag=3, train_per_tag=5)  # fmt: skip
    np.testing.assert_array_equal(again.split.query, split.query)  # seeded


def test_coco_protocol_with_labels_in_the_list(tmp_path):
    rng = np.random.default_rng(1)
    n = 40
    labels = (rng.random((n, 80)) < 0.05).astype(np.uint8)
    labels[:4] = 0  # images without a category are dropped
    labels[4:, 7] = 1
    paths = [f"train2014/COCO_{i:06d}.png" for i in range(n)]
    write_images(tmp_path, paths, size=(30, 20))
    (tmp_path / "database.txt").write_text("".join(f"{p} {' '.join(map(str, row))}\n" for p, row in zip(paths, labels, strict=True)))
    ds = load_coco(tmp_path, tmp_path / "database.txt", image_size=(8, 12), num_query=6, num_train=10)
    assert ds.labels.shape == (36, 80) and ds.inputs["image"].shape == (36, 8, 12, 3)
    assert (ds.split.query.size, ds.split.database.size, ds.split.train.size) == (6, 30, 10)
    (tmp_path / "list.txt").write_text("".join(f"{p}\n" for p in paths))
    np.savetxt(tmp_path / "labels.txt", labels, fmt="%d")
    separate = load_coco(tmp_path, tmp_path / "list.txt", tmp_path / "labels.txt", image_size=(8, 12), num_query=6, num_train=10)
    np.testing.assert_array_equal(separate.inputs["image"], ds.inputs["image"])


def test_bad_image_lists_are_clear_errors(tmp_path):
    labels, _ = nuswide_copy(tmp_path, n=30)
    with pytest.raises(DataFormatError, match="give a label file"):
        load_nuswide(tmp_path / "images", tmp_path / "ImageList.txt")
    with pytest.raises(DataFormatError, match="fewer than the 21 asked for"):
        load_nuswide(tmp_path / "images", tmp_path / "ImageList.txt", tmp_path / "Groundtruth" / "AllLabels")
    np.savetxt(tmp_path / "short.txt", labels[:10], fmt="%d")
    with pytest.raises(DataFormatError, match="10 label rows for 30 listed images"):
        load_nuswide(tmp_path / "images", tmp_path / "ImageList.txt", tmp_path / "short.txt", concepts=4)
    (tmp_path / "coco.txt").write_text("a.png 0 1\nb.png 1\n")
    with pytest.raises(DataFormatError, match="different numbers of labels"):
        load_coco(tmp_path, tmp_path / "coco.txt")
    (tmp_path / "coco.txt").write_text("a.png " + " ".join(["1"] * 80) + "\n")
    with pytest.raises(DataFormatError, match="a.png: cannot read the image"):
        load_coco(tmp_path, tmp_path / "coco.txt", num_query=0, num_train=0)
    (tmp_path / "twenty.txt").write_text("a.png " + " ".join(["1"] * 20) + "\n")
    with pytest.raises(DataFormatError, match="expected the 80 categories"):
        load_coco(tmp_path, tmp_path / "twenty.txt")
    with pytest.raises(DataFormatError, match="no such image list"):
        load_coco(tmp_path, tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="fewer than 50 queries"):
        per_tag_split(np.eye(3, dtype=np.uint8), 50, 1)
