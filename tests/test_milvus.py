"""The Milvus back-end on a real Milvus Lite: answers against BFlat, the model-version lock, and
the bad inputs (another dimension, another model version, a changed collection, an unreachable
server, names and limits)."""

from __future__ import annotations

import gc
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.tiers import starts
from tfhash.codes import pack_codes
from tfhash.index import (
    HashIndexError,
    IndexFormatError,
    IndexUnavailableError,
    MilvusIndex,
    index_factory,
    load_index,
)
from tfhash.index.milvus import LOCKS_COLLECTION, MAX_RESULTS, collection_name


def _clustered(rng, n, bits, clusters=20, flip=0.15, centres=None):
    """+-1 codes around a few centres (new ones unless given), so that neighbours and ties at small
    distances are many."""
    if centres is None:
        centres = rng.choice(np.array([-1, 1], np.int8), size=(clusters, bits))
    codes = centres[rng.integers(0, len(centres), n)].copy()
    codes[rng.random(codes.shape) < flip] *= -1
    return codes


@pytest.fixture
@starts("process")
def lite(tmp_path):
    """A Milvus Lite file; every index opened through ``open_`` is closed after the test."""
    opened = []

    def open_(bits, collection, **params):
        index = index_factory(bits, "Milvus", uri=str(tmp_path / "milvus.db"), collection=collection, **params)
        opened.append(index)
        return index

    yield open_
    for index in opened:
        index.close()


def test_answers_equal_bflat_distances_and_ids_up_to_ties(lite):
    rng = np.random.default_rng(0)
    centres = rng.choice(np.array([-1, 1], np.int8), size=(20, 64))
    db, queries = _clustered(rng, 5000, 64, centres=centres), _clustered(rng, 40, 64, centres=centres)
    ids = rng.permutation(100_000)[:5000].astype(np.int64)
    milvus, flat = lite(64, "items_v1"), index_factory(64, "BFlat")
    milvus.add(db, ids)
    flat.add(db, ids)
    assert milvus.ntotal == 5000 and not milvus.exact
    true = (64 - db.astype(np.int64) @ queries.astype(np.int64).T) // 2  # (items, queries) Hamming distances
    for k in (1, 10, 100):
        got, want = milvus.search(queries, k), flat.search(queries, k)
        np.testing.assert_array_equal(got.distances, want.distances)
        for q, (row_ids, row_d, want_ids, want_d) in enumerate(zip(got.ids, got.distances, want.ids, want.distances, strict=True)):
            inside = want_d < want_d[-1]  # strictly nearer than the k-th distance: the same ids
            assert set(row_ids[inside]) == set(want_ids[inside])
            position = {item: i for i, item in enumerate(ids)}  # each id at its true distance (ties included)
            assert [true[position[item], q] for item in row_ids] == row_d.tolist()
            for d in np.unique(row_d):  # equal distances in ascending id order
                assert np.all(np.diff(row_ids[row_d == d]) > 0)
    reached = 0
    for radius in (0, 10, 18):
        for got, want in zip(milvus.range_search(queries, radius), flat.range_search(queries, radius), strict=True):
            np.testing.assert_array_equal(got.distances, want.distances)  # inclusive radius, every item
            assert sorted(got.ids.tolist()) == sorted(want.ids.tolist())
            reached += got.ids.size
    assert reached > 1000  # the radii reach many items, so the comparison has something to compare


def test_add_remove_upsert_and_packed_queries(lite):
    rng = np.random.default_rng(1)
    codes = _clustered(rng, 300, 32)
    index = lite(32, "items_v1")
    index.add(codes[:200], np.arange(200) * 3)
    assert index.remove([0, 3, 10**9]) == 2 and index.ntotal == 198  # unknown ids are ignored
    index.upsert(codes[200:202], [6, 0])  # 6 replaced, 0 added back
    assert index.ntotal == 199
    hit = index.search(pack_codes(codes[200:202]), 1)  # packed uint8 queries, as the search service sends
    assert hit.ids[:, 0].tolist() == [6, 0] and hit.distances[:, 0].tolist() == [0, 0]
    with pytest.raises(HashIndexError, match=r"ids \[9\] are already in the index; use upsert"):
        index.add(codes[202:204], [1000, 9])
    with pytest.raises(HashIndexError, match="have 16 bits, the index holds 32-bit codes"):
        index.search(np.ones((1, 16), np.int8), 1)
    with pytest.raises(HashIndexError, match="k = 200 is larger than the 199 items"):
        index.search(codes[:1], 200)
    assert index.ntotal == 199  # refused calls change nothing


def test_save_load_and_the_model_version_lock(lite, tmp_path):
    rng = np.random.default_rng(2)
    codes = _clustered(rng, 500, 64)
    index = lite(64, "items_v3")
    index.add(codes)
    index.save(tmp_path / "3" / "Milvus", model_version="3", signature_fingerprint="fp3")
    loaded = load_index(tmp_path / "3" / "Milvus", expected_model_version="3")
    try:
        assert loaded.ntotal == 500 and loaded.params() == index.params()
        np.testing.assert_array_equal(loaded.search(codes[:5], 7).distances, index.search(codes[:5], 7).distances)
    finally:
        loaded.close()
    with pytest.raises(IndexFormatError, match="built for model version '3', not '4'"):
        load_index(tmp_path / "3" / "Milvus", expected_model_version="4")

    # the same collection rebuilt and saved by model version 4: version 3's directory is refused
    rebuilt = lite(64, "items_v3", replace=True)
    rebuilt.add(codes)
    rebuilt.save(tmp_path / "4" / "Milvus", model_version="4", signature_fingerprint="fp4")
    with pytest.raises(IndexFormatError, match="locked to model version '4', the index directory names '3'"):
        load_index(tmp_path / "3" / "Milvus", expected_model_version="3")
    assert load_index(tmp_path / "4" / "Milvus", expected_model_version="4").ntotal == 500

    # a change through tfhash after the save drops the lock until the next save
    rebuilt.add(codes[:1], [10**6])
    with pytest.raises(IndexFormatError, match="has no tfhash lock: it changed after the index was saved"):
        load_index(tmp_path / "4" / "Milvus")
    rebuilt.save(tmp_path / "4" / "Milvus", model_version="4", signature_fingerprint="fp4")
    assert load_index(tmp_path / "4" / "Milvus").ntotal == 501


def test_load_checks_the_signature_fingerprint_through_manifest_and_lock(lite, tmp_path):
    rng = np.random.default_rng(5)
    codes = _clustered(rng, 100, 32)
    index = lite(32, "items_v5")
    index.add(codes)
    index.save(tmp_path / "a" / "Milvus", model_version="5", signature_fingerprint="fp-a")
    loaded = load_index(tmp_path / "a" / "Milvus", expected_model_version="5", expected_signature_fingerprint="fp-a")
    try:
        assert len(loaded) == 100
        distances, ids = loaded.search(codes[:3], 4)  # FAISS's order, as every index type
        np.testing.assert_array_equal(distances, index.search(codes[:3], 4).distances)
    finally:
        loaded.close()
    with pytest.raises(IndexFormatError, match="built for SavedModel signature fingerprint 'fp-a', not 'fp-b'; rebuild"):
        load_index(tmp_path / "a" / "Milvus", expected_signature_fingerprint="fp-b")  # refused by its manifest

    # the collection rebuilt by another SavedModel of the same version: the old directory's manifest
    # still names fp-a, as expected, but the collection's lock names fp-b
    rebuilt = lite(32, "items_v5", replace=True)
    rebuilt.add(codes)
    rebuilt.save(tmp_path / "b" / "Milvus", model_version="5", signature_fingerprint="fp-b")
    with pytest.raises(IndexFormatError, match="locked to model signature fingerprint 'fp-b', the index directory names 'fp-a'"):
        load_index(tmp_path / "a" / "Milvus", expected_signature_fingerprint="fp-a")
    assert len(load_index(tmp_path / "b" / "Milvus", expected_signature_fingerprint="fp-b")) == 100
    rebuilt.save(tmp_path / "c" / "Milvus", model_version="5")  # no fingerprint recorded
    with pytest.raises(IndexFormatError, match="records no SavedModel signature fingerprint, so it cannot be checked against 'fp-b'"):
        load_index(tmp_path / "c" / "Milvus", expected_signature_fingerprint="fp-b")


def test_a_collection_of_another_dimension_or_count_is_refused(lite, tmp_path):
    from pymilvus import MilvusClient

    rng = np.random.default_rng(3)
    index = lite(64, "items_v1")
    index.add(_clustered(rng, 50, 64))
    index.save(tmp_path / "idx", model_version="1")
    index.close()
    other = lite(32, "items_v1", replace=True)  # another model's 32-bit codes under the same name
    other.add(_clustered(rng, 50, 32))
    with pytest.raises(IndexFormatError, match="holds 32-bit codes, the index is of 64-bit codes"):
        load_index(tmp_path / "idx")
    other.close()
    again = lite(64, "items_v2")
    again.add(_clustered(rng, 50, 64))
    again.save(tmp_path / "idx2", model_version="2")
    client = MilvusClient(str(tmp_path / "milvus.db"))  # another Milvus client deletes rows
    client.delete("items_v2", ids=[0, 1])
    client.close()
    with pytest.raises(IndexFormatError, match="manifest says 50 items, files hold 48"):
        load_index(tmp_path / "idx2")
    client = MilvusClient(str(tmp_path / "milvus.db"))
    client.drop_collection("items_v2")
    client.close()
    with pytest.raises(IndexFormatError, match="collection items_v2 does not exist"):
        load_index(tmp_path / "idx2")


def test_unreachable_server_is_a_clear_error_quickly(tmp_path):
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    with pytest.raises(IndexUnavailableError, match=f"cannot reach Milvus at {uri} within 1 s.*check that the server runs"):
        index_factory(16, "Milvus", uri=uri, collection="items", timeout=1)


def test_bad_arguments_name_the_fix(lite, tmp_path):
    with pytest.raises(HashIndexError, match="needs uri=: a Milvus Lite file"):
        index_factory(16, "Milvus", collection="items")
    for name in (None, "1items", "items-v1", "x" * 256):
        with pytest.raises(HashIndexError, match="collection must be a Milvus collection name"):
            index_factory(16, "Milvus", uri=str(tmp_path / "m.db"), collection=name)
    with pytest.raises(HashIndexError, match="timeout must be a positive number"):
        index_factory(16, "Milvus", uri=str(tmp_path / "m.db"), collection="items", timeout=0)
    lite(16, "items")
    with pytest.raises(HashIndexError, match="collection items already exists.*replace=True"):
        lite(16, "items")
    assert collection_name("tiny-mnist", 1764000000, "text") == "tiny_mnist_v1764000000_text"
    assert collection_name("3d", 2) == "_3d_v2"
    with pytest.raises(HashIndexError, match="no range_search|radius must be >= 0"):
        lite(16, "other").range_search(np.ones((1, 16), np.int8), -1)
    assert LOCKS_COLLECTION.startswith("tfhash")


def test_milvus_result_limits_are_refused_not_truncated(lite):
    index = lite(16, "many")
    index.add(np.ones((MAX_RESULTS + 10, 16), np.int8))  # every item at distance 0 from the query
    with pytest.raises(HashIndexError, match=f"above Milvus's limit of {MAX_RESULTS} results"):
        index.search(np.ones((1, 16), np.int8), MAX_RESULTS + 1)
    with pytest.raises(HashIndexError, match=f"more than {MAX_RESULTS} items within radius 0"):
        index.range_search(np.ones((1, 16), np.int8), 0)
    assert index.search(np.ones((1, 16), np.int8), MAX_RESULTS).ids.shape == (1, MAX_RESULTS)


@pytest.mark.process
def test_closing_frees_the_lite_file_for_another_process(lite, tmp_path):
    index = lite(16, "items")
    index.add(np.ones((3, 16), np.int8))
    index.save(tmp_path / "idx", model_version="1")
    script = ("import sys; from tfhash.index import load_index\n"
              "index = load_index(sys.argv[1], expected_model_version='1'); print(index.ntotal); index.close()")  # fmt: skip
    held = subprocess.run([sys.executable, "-c", script, str(tmp_path / "idx")], capture_output=True, text=True, timeout=120)
    assert held.returncode != 0 and "IndexUnavailableError: cannot open the Milvus Lite file" in held.stderr
    assert "a Lite file is open in one process at a time" in held.stderr  # while this process holds it
    index.close()
    index.close()  # twice is harmless
    with pytest.raises(HashIndexError, match="is closed; load it again"):
        index.search(np.ones((1, 16), np.int8), 1)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "idx")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "3"
    dropped = load_index(tmp_path / "idx")  # dropped without close(): released once unreferenced
    assert isinstance(dropped, MilvusIndex)
    del dropped
    gc.collect()
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "idx")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
