"""Where a file lives: local paths as before, URIs untouched and read through ``tf.io.gfile``
(here TensorFlow's in-memory ``ram://`` file system, whose listings leave out folders and whose
writes to an existing file append: flat folders, new files; the Cloud Storage bucket is
tests/test_remote_pipeline.py's), an index saved to and loaded from a URI, and a scheme TensorFlow
cannot open refused with what to install; staging folders a killed process left are removed by the
next one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid

import numpy as np
import pytest

from tfhash import storage


@pytest.fixture
def ram():
    """A fresh folder of TensorFlow's in-memory file system (flat: its listings leave out folders)."""
    return f"ram://tfhash-tests/{uuid.uuid4().hex}"


@pytest.mark.parametrize(("base", "value", "expected"), [
    ("/configs", "runs/x", "/configs/runs/x"),
    ("/configs", "/abs/run", "/abs/run"),
    ("/configs", "gs://bucket/run", "gs://bucket/run"),
    ("/configs", "gs://bucket/run/", "gs://bucket/run"),
    ("gs://bucket/configs", "runs/x", "gs://bucket/configs/runs/x"),
    ("/configs", None, None),
])  # fmt: skip
def test_a_uri_is_never_a_local_path(base, value, expected):
    assert storage.resolve(base, value) == expected


def test_joining_and_splitting_paths_and_uris():
    assert storage.join("gs://bucket/run/", "serving", "name") == "gs://bucket/run/serving/name"
    assert storage.join("/run", "serving") == os.path.join("/run", "serving")
    assert storage.parent("gs://bucket/data/items.csv") == "gs://bucket/data"
    assert storage.basename("s3://bucket/a/gallery.html") == "gallery.html"
    assert storage.is_uri("gs://b") and storage.is_uri("s3://b/x") and not storage.is_uri("/tmp/gs:/b") and not storage.is_uri("runs")


def test_local_writes_are_whole_and_missing_files_are_file_not_found(tmp_path):
    path = tmp_path / "deep" / "folder" / "file.json"
    storage.write_json(str(path), {"a": 1})
    assert storage.read_json(str(path)) == {"a": 1} and os.listdir(path.parent) == ["file.json"]  # no temporary left
    for missing in (str(tmp_path / "none"), "ram://tfhash-tests/none"):
        with pytest.raises(FileNotFoundError):
            storage.read_bytes(missing)
    storage.remove(str(tmp_path / "none"))  # nothing to remove is no error
    storage.rmtree(str(tmp_path / "none"))


@pytest.mark.process
def test_a_staging_folder_a_killed_process_left_is_removed_by_the_next_build(tmp_path):
    # a real builder killed mid-write (SIGKILL: no cleanup runs), as a crash or the OOM killer does
    builder = subprocess.Popen([sys.executable, "-c", "import os, sys, time; from tfhash import storage; "
                                "p = storage.staging_folder(sys.argv[1], '.building-'); "
                                "open(os.path.join(p, 'activations.npy'), 'wb').write(bytes(1000)); "
                                "print(p, flush=True); time.sleep(120)", str(tmp_path)],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    left = builder.stdout.readline().strip()
    builder.send_signal(signal.SIGKILL)
    builder.wait()
    builder.stdout.close()
    assert os.path.isfile(os.path.join(left, "activations.npy"))
    elsewhere = tmp_path / f".building-{socket.gethostname()}x-1-abc"  # another host's (shared disk)
    other = tmp_path / ".index.tmp-1-abc"  # another kind of staging
    elsewhere.mkdir(), other.mkdir()
    alive = storage.staging_folder(tmp_path, ".building-")
    assert not os.path.exists(left) and elsewhere.is_dir() and other.is_dir()
    fresh = storage.staging_folder(tmp_path, ".building-")
    assert os.path.isdir(alive)  # this process's is alive: kept
    assert os.path.isdir(fresh) and not os.listdir(fresh) and fresh != alive


def test_files_under_a_uri_and_a_copy_with_its_marker_last(ram, tmp_path):
    storage.write_bytes(f"{ram}/b.npy", b"12345")
    storage.write_text(f"{ram}/manifest.json", "{}")
    storage.write_text(f"{ram}/a.npy", "x")
    assert [name for name, _, _ in storage.files_under(ram)] == ["a.npy", "b.npy", "manifest.json"]
    assert storage.files_under(f"{ram}/b.npy")[0][:2] == ("", 5) and storage.files_under(f"{ram}/none") == []
    written = []
    original = storage.write_bytes

    def recording(path, data):
        written.append(storage.basename(path))
        original(path, data)

    storage.write_bytes = recording
    try:
        storage.copy_tree(ram, str(tmp_path / "copy"), last="manifest.json")
    finally:
        storage.write_bytes = original
    assert written == ["a.npy", "b.npy", "manifest.json"] and (tmp_path / "copy" / "b.npy").read_bytes() == b"12345"


def test_a_local_copy_is_shared_and_follows_the_content(ram):
    storage.write_bytes(f"{ram}/codes.npy", b"abc")
    first = storage.local_copy(ram)
    assert first.startswith(os.environ["TFHASH_CACHE_DIR"]) and storage.local_copy(ram) == first
    storage.write_bytes(f"{ram}/ids.npy", b"abcd")  # another content: another copy, the old one gone
    second = storage.local_copy(ram)
    assert second != first and not os.path.exists(first) and sorted(os.listdir(second)) == ["codes.npy", "ids.npy"]
    assert storage.local_copy("/some/local/folder") == "/some/local/folder"
    with pytest.raises(FileNotFoundError, match="no files under this URI"):
        storage.local_copy(f"{ram}-empty")


def test_an_index_saved_to_a_uri_loads_locked_to_its_model_and_a_damaged_one_is_refused(ram):
    """Loaded through a local copy; a file damaged in the store is a new copy, refused by its
    checksum; a damaged local copy is downloaded again."""
    from tfhash.index import IndexFormatError, index_factory, load_index

    rng = np.random.default_rng(0)
    codes, ids = rng.integers(0, 256, size=(50, 4), dtype=np.uint8), np.arange(100, 150)
    index = index_factory(32, "BFlat")
    index.add(codes, ids)
    index.save(f"{ram}/7/BFlat", model_version="7")
    assert [name for name, _, _ in storage.files_under(f"{ram}/7/BFlat")] == ["codes.npy", "ids.npy", "manifest.json"]
    loaded = load_index(f"{ram}/7/BFlat", expected_model_version="7", mapped=True)
    np.testing.assert_array_equal(loaded.search(codes[:5], 3).ids, index.search(codes[:5], 3).ids)
    with pytest.raises(IndexFormatError, match=f"{ram}/7/BFlat.*built for model version '7', not '8'"):
        load_index(f"{ram}/7/BFlat", expected_model_version="8")
    damaged = storage.read_bytes(f"{ram}/7/BFlat/codes.npy")
    storage.remove(f"{ram}/7/BFlat/codes.npy")
    storage.write_bytes(f"{ram}/7/BFlat/codes.npy", damaged[:-1])  # cut short: a new size, so a new copy
    with pytest.raises(IndexFormatError, match=rf"{ram}/7/BFlat \(its local copy\): checksum mismatch for codes.npy"):
        load_index(f"{ram}/7/BFlat")
    with pytest.raises(IndexFormatError, match="no manifest.json; not a tfhash index directory"):
        load_index(f"{ram}/8/BFlat")
    index.save(f"{ram}/9/BFlat", model_version="9")  # an intact index whose local copy is damaged
    copy = storage.local_copy(f"{ram}/9/BFlat", "indexes")
    with open(os.path.join(copy, "codes.npy"), "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        last = handle.read(1)
        handle.seek(-1, os.SEEK_END)
        handle.write(bytes([last[0] ^ 1]))
    assert load_index(f"{ram}/9/BFlat", expected_model_version="9").ntotal == 50


def test_a_scheme_tensorflow_cannot_open_is_refused_with_what_to_install(tmp_path):
    from click.testing import CliRunner

    from tfhash.cli import main

    with pytest.raises(ValueError, match=r"s3://bucket/x: TensorFlow has no file system for s3:// here; install tensorflow-io"):
        storage.check_scheme("s3://bucket/x")
    storage.check_scheme(str(tmp_path))  # a path passes
    result = CliRunner().invoke(main, ["data", "export", "mnist", "--output", "s3://bucket/mnist"])
    assert result.exit_code == 2 and "TensorFlow has no file system for s3://" in result.output
