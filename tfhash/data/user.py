"""Loaders that turn your own images or feature files into a :class:`HashingDataset`.

A folder of images by class (or a CSV listing image files and their labels), or NumPy / CSV
feature matrices (one or two modalities, paired by row) with class ids, class names or multi-hot
labels, and a seeded random split (:func:`load_user_dataset`). Ordinary messy folders are handled
and every change is recorded (:func:`read_images`). The result exports like the shipped datasets
(``tfhash data export-user``, then the pipeline).
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from tfhash.artifacts import split_labels
from tfhash.data.dataset import DataFormatError, HashingDataset
from tfhash.data.splits import random_split
from tfhash.labels import LabelError, multi_hot

__all__ = ["load_labels", "load_user_dataset", "image_query"]


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
#: Modes of single-channel images (kept greyscale when every image of a folder is one).
GREY_MODES = ("1", "L", "I;16", "I;16B", "I;16L", "I", "F")
#: A first cell of a one-column labels file that names the column rather than a class.
HEADER_NAMES = ("label", "labels", "class", "classes", "category", "tag", "tags")
#: How many files an error message lists.
SHOWN_FILES = 20
#: Default split of a folder: at most this many queries (a tenth of the items on small folders)...
DEFAULT_QUERIES = 100
#: ...and at most this many training items (the rest of a small folder).
DEFAULT_TRAIN = 1000


def _listing(items: list[str], total: int | None = None) -> str:
    shown = items[:SHOWN_FILES]
    more = (total or len(items)) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _to_array(image: Image.Image, colour: bool) -> np.ndarray:
    """``uint8`` pixels: RGB (transparency laid on white) when ``colour``, else one grey channel."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # 16-bit or float grey: scale to 8 bits
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") else max(float(values.max()), 1.0)
        image = Image.fromarray(np.clip(values * 255.0 / top, 0, 255).astype(np.uint8), "L")
    if not colour:
        return np.asarray(image.convert("L"), dtype=np.uint8)
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba)
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def read_images(files: list[Path], root: Path, size: tuple[int, int] | None = None, skip_bad: bool = False) -> tuple[list, dict]:
    """The pixels of ``files`` (paths shown relative to ``root``) in one colour space and size.

    Ordinary messy folders are handled, and every change is recorded in the notes:

    * greyscale, palette, CMYK and transparent images become RGB beside colour ones (transparency
      on white); a folder of greyscale images only stays greyscale;
    * images of several sizes are refused with the sizes found and the most common one to resize
      to, unless ``size`` resizes them all;
    * every unreadable file is listed in one error; with ``skip_bad`` the rest is read and the
      skipped files recorded with the reason.

    Returns:
        ``(arrays, notes)``: one ``uint8`` array per readable file (None for a skipped one), and
        what was done: ``{"colour", "size", "converted": {mode: count}, "resized": count,
        "skipped": [{"path", "reason"}]}``.

    Raises:
        DataFormatError: unreadable files (all of them listed; ``skip_bad`` skips them instead),
            or several sizes without ``size``.
    """
    opened, bad = [], []
    for file in files:
        try:
            with Image.open(file) as image:
                image.load()
                opened.append(image.copy())
        except (UnidentifiedImageError, OSError, ValueError) as err:
            bad.append({"path": file.relative_to(root).as_posix(), "reason": str(err).strip() or type(err).__name__})
            opened.append(None)
    if bad and not skip_bad:
        listed = [f"{b['path']} ({b['reason']})" for b in bad]
        raise DataFormatError(f"{root}: {len(bad)} file(s) cannot be read as images: {_listing(listed)}. Remove or "
                              "replace them, or pass --skip-bad (skip_bad=True) to export the rest and record them")  # fmt: skip
    readable = [image for image in opened if image is not None]
    if not readable:
        raise DataFormatError(f"{root}: none of the {len(files)} image files can be read")
    colour = any(image.mode not in GREY_MODES for image in readable)
    target = "RGB" if colour else "L"
    converted = Counter(image.mode for image in readable if image.mode != target)
    sizes = Counter((image.height, image.width) for image in readable)
    if size is None and len(sizes) > 1:
        common = sizes.most_common(1)[0][0]
        found = ", ".join(f"{h}x{w} ({n} image{'s' if n > 1 else ''})" for (h, w), n in sizes.most_common(6))
        raise DataFormatError(f"{root}: images of {len(sizes)} sizes (height x width): {found}; pass --image-size "
                              f"{common[0]} {common[1]} (image_size=({common[0]}, {common[1]}), the most common) to "
                              "resize them all")  # fmt: skip
    height, width = size if size is not None else next(iter(sizes))
    arrays, resized = [], 0
    for image in opened:
        if image is None:
            arrays.append(None)
            continue
        if (image.height, image.width) != (height, width):
            image, resized = image.resize((width, height), Image.BILINEAR), resized + 1
        arrays.append(_to_array(image, colour))
    notes = {"colour": "RGB" if colour else "grey", "size": [int(height), int(width)],
             "converted": {f"{mode} to {target}": count for mode, count in sorted(converted.items())}, "resized": resized,
             "skipped": bad}  # fmt: skip
    return arrays, notes


def _image_files(folder: Path) -> tuple[list[Path], list[str]]:
    """The image files under ``folder`` (any depth, sorted) and the other files left out."""
    files, other = [], []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue  # hidden files (.DS_Store) and folders
        (files if path.suffix.lower() in IMAGE_SUFFIXES else other).append(path)
    return files, other


def load_image_folder(path: str | os.PathLike, size: tuple[int, int] | None = None, skip_bad: bool = False):
    """Images of ``<path>/<class>/<image>`` (images may sit deeper in a class folder), one class per
    sub-folder, classes in sorted order; or, when ``path`` is a ``.csv`` file, the images it lists
    (:func:`load_image_list`).

    Files that are not images (by their suffix) are left out and counted in the notes; hidden
    files and folders are left out.

    Args:
        size: ``(height, width)`` to resize every image to; without it all images must share one
            size.
        skip_bad: leave out unreadable files (recorded in the notes) instead of failing.

    Returns:
        ``(uint8 images (n, H, W, 3) or, for an all-grey folder, (n, H, W), multi-hot labels
        (n, C), class names, paths relative to the folder, notes)``; the notes as
        :func:`read_images` returns them, plus the files left out (``"not images"``).

    Raises:
        DataFormatError: no class folders, a class without images, unreadable images, or mixed
            sizes (see :func:`read_images`).
    """
    root = Path(path)
    if root.is_file() and root.suffix.lower() == ".csv":
        return load_image_list(root, size, skip_bad)
    if not root.is_dir():
        raise DataFormatError(f"{root}: not a folder of class sub-folders (<folder>/<class>/<image>) nor a .csv list of "
                              "image files and labels")  # fmt: skip
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataFormatError(f"{root}: no class sub-folders (expected <folder>/<class>/<image>)")
    files, ids, left_out = [], [], []
    for class_id, name in enumerate(classes):
        found, other = _image_files(root / name)
        if not found:
            raise DataFormatError(f"{root / name}: class folder without images ({', '.join(IMAGE_SUFFIXES)})")
        files += found
        ids += [class_id] * len(found)
        left_out += [p.relative_to(root).as_posix() for p in other]
    arrays, notes = read_images(files, root, size, skip_bad)
    keep = [i for i, array in enumerate(arrays) if array is not None]
    labels = multi_hot(np.asarray(ids)[keep], len(classes), dtype=np.uint8)
    empty = [classes[c] for c in range(len(classes)) if not labels[:, c].any()]
    if empty:
        raise DataFormatError(f"{root}: no readable image left in class folder(s) {empty}")
    notes["not images"] = {"count": len(left_out), "examples": left_out[:SHOWN_FILES]}
    paths = [files[i].relative_to(root).as_posix() for i in keep]
    return np.stack([arrays[i] for i in keep]), labels, classes, paths, notes


def _csv_rows(path: Path) -> list[list[str]]:
    """The non-empty rows of a CSV file, cells stripped."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = [[cell.strip() for cell in row] for row in csv.reader(handle)]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataFormatError(f"{path}: cannot read the CSV file ({err})") from err
    return [row for row in rows if any(row)]


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def labels_from_names(cells: list[str], where: str) -> tuple[np.ndarray, list[str]]:
    """Class names, one cell per item (several separated by ``;`` for multi-label items), as
    ``(multi-hot (n, C), sorted class names)``."""
    names = [split_labels(cell) for cell in cells]
    empty = [i for i, row in enumerate(names) if not row]
    if empty:
        raise DataFormatError(f"{where}: rows {empty[:SHOWN_FILES]} have no label; every item needs one")
    classes = sorted({name for row in names for name in row})
    index = {name: i for i, name in enumerate(classes)}
    labels = np.zeros((len(names), len(classes)), np.uint8)
    for row, row_names in enumerate(names):
        labels[row, [index[name] for name in row_names]] = 1
    return labels, classes


def load_image_list(path: str | os.PathLike, size: tuple[int, int] | None = None, skip_bad: bool = False):
    """Images listed in a CSV file, one per row: ``path,labels`` (an optional header row; paths
    relative to the CSV's folder; labels as class names, ``;`` between several). Returns what
    :func:`load_image_folder` returns; classes in sorted order."""
    path = Path(path)
    rows = _csv_rows(path)
    if rows and [cell.lower() for cell in rows[0][:2]] == ["path", "labels"]:
        rows = rows[1:]
    short = [i for i, row in enumerate(rows) if len(row) < 2]
    if not rows or short:
        raise DataFormatError(f"{path}: an image list has rows 'path,labels' (class names, ';' between several); "
                              f"rows {short[:SHOWN_FILES]} have fewer cells")  # fmt: skip
    root = path.parent
    files = [(root / row[0]) for row in rows]  # a listed file that does not exist is unreadable (read_images)
    labels, classes = labels_from_names([row[1] for row in rows], str(path))
    arrays, notes = read_images(files, root, size, skip_bad)
    keep = [i for i, array in enumerate(arrays) if array is not None]
    notes["not images"] = {"count": 0, "examples": []}
    paths = [rows[i][0] for i in keep]
    return np.stack([arrays[i] for i in keep]), labels[keep], classes, paths, notes


def load_matrix(path: str | os.PathLike) -> np.ndarray:
    """A 2-D numeric matrix from ``.npy`` (no pickle) or ``.csv`` (comma separated; a header row
    of column names is skipped)."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    if path.suffix == ".npy":
        try:
            array = np.load(path, allow_pickle=False)
        except ValueError as err:
            raise DataFormatError(f"{path}: not a numeric matrix ({err})") from err
    elif path.suffix == ".csv":
        rows = _csv_rows(path)
        if rows and not all(_is_number(cell) for cell in rows[0]):
            rows = rows[1:]  # a header row
        bad = [i + 1 for i, row in enumerate(rows) if not all(_is_number(cell) for cell in row)]
        if bad or len({len(row) for row in rows}) > 1:
            raise DataFormatError(f"{path}: not a numeric matrix (rows {bad[:SHOWN_FILES]} hold text, or rows differ in "
                                  "length)")  # fmt: skip
        array = np.asarray([[float(cell) for cell in row] for row in rows], dtype=np.float64)
    else:
        raise DataFormatError(f"{path}: use a .npy or .csv file")
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.number):
        raise DataFormatError(f"{path}: expected a 2-D numeric matrix, got shape {array.shape} ({array.dtype})")
    return array


def load_labels(path: str | os.PathLike) -> tuple[np.ndarray, list[str]]:
    """The labels file of :func:`load_user_dataset` as ``((n, C) uint8 multi-hot, class names)``:
    one column of class ids or class names (``;`` between several; a header cell such as
    ``label`` is skipped), or C columns of 0/1 (:func:`tfhash.labels.multi_hot`) whose header
    row, if any, names the classes.

    Raises:
        DataFormatError: the file's values are not labels (naming the file and the rows).
    """
    path = Path(path)
    rows = _csv_rows(path) if path.suffix == ".csv" else None
    if rows and all(len(row) == 1 for row in rows):
        cells = [row[0] for row in rows]
        header = cells[0].lower() in HEADER_NAMES or (len(cells) > 1 and not _is_number(cells[0])
                                                      and all(_is_number(cell) for cell in cells[1:]))  # fmt: skip
        cells = cells[1:] if header else cells
        if not all(_is_number(cell) for cell in cells):
            return labels_from_names(cells, str(path))
        matrix = np.asarray([[float(cell)] for cell in cells])
    else:
        matrix = load_matrix(path)
    labels = _checked_labels(matrix, path)
    header = rows[0] if rows and matrix.shape[1] > 1 and not all(_is_number(cell) for cell in rows[0]) else None
    return labels, header if header is not None and len(header) == labels.shape[1] else [str(c) for c in range(labels.shape[1])]


def _checked_labels(matrix: np.ndarray, path) -> np.ndarray:
    try:
        return multi_hot(matrix[:, 0] if matrix.shape[1] == 1 else matrix, name="labels", dtype=np.uint8)
    except LabelError as err:
        raise DataFormatError(f"{path}: {err}") from err


def split_sizes(n: int, num_query: int | None, num_train: int | None) -> tuple[int, int]:
    """The split of ``n`` items: ``num_query`` / ``num_train`` as given, or defaults that fit
    (:data:`DEFAULT_QUERIES` queries, a tenth of a small folder; :data:`DEFAULT_TRAIN` training
    items, the rest of a small folder).

    Raises:
        ValueError: sizes that do not fit, naming sizes that would.
    """
    queries = num_query if num_query is not None else min(DEFAULT_QUERIES, max(1, n // 10))
    train = num_train if num_train is not None else min(DEFAULT_TRAIN, n - queries)
    if queries < 1 or train < 1 or queries + train > n:
        fit_queries = min(DEFAULT_QUERIES, max(1, n // 10))
        raise ValueError(f"{queries} queries + {train} train exceed the {n} items (each split needs at least one); "
                         f"with {n} items use e.g. --queries {fit_queries} --train {n - fit_queries}, or leave both out "
                         "for defaults that fit")  # fmt: skip
    return queries, train


def load_user_dataset(features: dict[str, str] | None = None, labels: str | None = None, images: str | None = None,
                      image_size: tuple[int, int] | None = None, num_query: int | None = None,
                      num_train: int | None = None, seed: int = 0, name: str = "custom",
                      skip_bad: bool = False) -> HashingDataset:  # fmt: skip
    """Build a dataset from files: either ``images`` (a class-folder tree, labels from the
    folders, or a CSV list of image files and labels) or ``features`` (modality name ->
    .npy/.csv, rows paired across modalities) with a ``labels`` file. Split: ``num_query``
    random queries, the rest the database, ``num_train`` of it trains (seeded; defaults that fit,
    :func:`split_sizes`).

    ``extra`` carries each row's path (``extra["paths"]``: the image's path relative to the folder
    or list, empty for feature rows), so that ``items.csv`` maps every id back to its file and
    classes, and what the reading did (``notes``), which
    :func:`tfhash.data.export.export_tfrecords` writes to ``metadata.json``."""
    if bool(images) == bool(features):
        raise ValueError("give either an image folder (or a CSV list of images) or feature files (with a labels file)")
    if images:
        if labels:
            raise ValueError("an image folder takes its labels from its class folders (a list, from its labels column); "
                             "drop the labels file")  # fmt: skip
        array, label_matrix, class_names, paths, notes = load_image_folder(images, image_size, skip_bad)
        root = Path(images).parent if Path(images).is_file() else Path(images)  # what the paths are relative to
        inputs, extra = {"image": array}, {"paths": paths, "notes": {"images": notes}, "image_root": str(root.resolve())}
    else:
        if not labels:
            raise ValueError("feature files need a labels file (class ids, class names or multi-hot)")
        inputs = {modality: load_matrix(path).astype(np.float32) for modality, path in features.items()}
        label_matrix, class_names = load_labels(labels)
        for modality, array in inputs.items():
            bad = np.flatnonzero(~np.isfinite(array).all(axis=1))
            if bad.size:
                raise DataFormatError(f"modality {modality!r} contains NaN or infinity in rows {bad[:SHOWN_FILES].tolist()}")
        extra = {"paths": [""] * len(label_matrix), "notes": {}}
    n = label_matrix.shape[0]
    queries, train = split_sizes(n, num_query, num_train)
    return HashingDataset(name, inputs, label_matrix, class_names, random_split(n, queries, train, seed), extra)


def image_query(image, data_dir: str | os.PathLike, feature: str = "image") -> bytes:
    """A query image of your own as the serialized ``tf.Example`` the served model takes: read,
    converted and resized as ``tfhash data export-user`` wrote the folder at ``data_dir`` (its
    ``metadata.json``: the images' size, and RGB or grey).

    Args:
        image: a file path, or the image file's bytes.
        feature: the image's feature name (the modality, ``image`` for an exported image folder).

    Raises:
        DataFormatError: an unreadable image, or a ``data_dir`` without image metadata.
    """
    import io

    from tfhash.artifacts import read_data_description
    from tfhash.data.export import to_example

    try:
        shape = read_data_description(os.fspath(data_dir))["modalities"][feature]["shape"]
    except (OSError, ValueError, KeyError) as err:
        raise DataFormatError(f"{data_dir}: no {feature!r} images described in metadata.json ({err})") from err
    try:
        with Image.open(io.BytesIO(image) if isinstance(image, bytes) else image) as opened:
            opened.load()
            if (opened.height, opened.width) != tuple(shape[:2]):
                opened = opened.resize((shape[1], shape[0]), Image.BILINEAR)
            pixels = _to_array(opened, colour=len(shape) == 3)
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise DataFormatError(f"{image if not isinstance(image, bytes) else 'the image'}: cannot read the image ({err})") from err
    return to_example({feature: pixels}, np.zeros(0), -1).SerializeToString()
