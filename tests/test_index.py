"""Indexes against an independent brute-force reference written here; persistence and errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfhash.codes import pack_codes
from tfhash.index import (
    INDEX_TYPES,
    RANGE_SEARCH,
    TRAIN,
    BinaryIndex,
    HashIndexError,
    IndexFormatError,
    MilvusIndex,
    check_model,
    index_factory,
    load_index,
    read_manifest,
)
from tfhash.index.base import BACKEND_EXTRA, BACKEND_PACKAGES
from tfhash.index.factory import FORMAT_TAGS
from tfhash.index.tf_search import HammingTopK, export_hamming_search

#: Every index type; Milvus's (Milvus Lite) starts its server process.
EVERY_INDEX_TYPE = [pytest.param(name, marks=pytest.mark.process) if name == "Milvus" else name for name in INDEX_TYPES]


def _codes(rng, n, bits, centres=None, flip=0.2):
    if centres is None:
        return rng.choice(np.array([-1, 1], np.int8), size=(n, bits))
    codes = centres[rng.integers(0, len(centres), n)].copy()
    codes[rng.random(codes.shape) < flip] *= -1
    return codes


def _reference(db, ids, queries, k):
    """Plain loops: sort (distance, insertion position) per query."""
    bits = db.shape[1]
    out_d, out_i = [], []
    for q in queries:
        dist = [(bits - int(np.dot(q.astype(int), x.astype(int)))) // 2 for x in db]
        order = sorted(range(len(db)), key=lambda j: (dist[j], j))[:k]
        out_d.append([dist[j] for j in order])
        out_i.append([ids[j] for j in order])
    return np.array(out_d), np.array(out_i)


@pytest.mark.parametrize("bits, k", [(16, 1), (16, 60), (64, 10)])
def test_flat_search_equals_brute_force_with_stable_ties(bits, k):
    rng = np.random.default_rng(0)
    db, queries = _codes(rng, 400, bits), _codes(rng, 12, bits)
    ids = rng.permutation(10_000)[:400] * 7  # external ids unrelated to position
    index = index_factory(bits, "BFlat")
    index.add(db, ids)
    result = index.search(queries, k)
    expected_d, expected_i = _reference(db, ids, queries, k)
    np.testing.assert_array_equal(result.distances, expected_d)
    np.testing.assert_array_equal(result.ids, expected_i)
    assert index.exact and index.describe()["count"] == 400


def test_range_search_inclusive_radius():
    rng = np.random.default_rng(1)
    db, queries = _codes(rng, 300, 16), _codes(rng, 5, 16)
    index = BinaryIndex(16)
    index.add(pack_codes(db))
    for radius in (0, 3, 6):
        for q, found in zip(queries, index.range_search(queries, radius), strict=True):
            dist = (16 - db.astype(int) @ q.astype(int)) // 2
            expected = [j for j in sorted(range(300), key=lambda j: (dist[j], j)) if dist[j] <= radius]
            assert found.ids.tolist() == expected
            assert found.distances.tolist() == [dist[j] for j in expected]


@pytest.mark.parametrize("description, params", [("BIVF16", {"nprobe": 16}), ("BIVF16", {"nprobe": 2}), ("BMultiHash4", {"nflip": 2})])
def test_sublinear_indexes_are_honest_and_recall(description, params):
    rng = np.random.default_rng(2)
    centres = _codes(rng, 20, 64)
    db, queries = _codes(rng, 4000, 64, centres), _codes(rng, 50, 64, centres)
    exact = index_factory(64, "BFlat")
    exact.add(db)
    approx = index_factory(64, description, **params)
    approx.add(db)
    assert not approx.exact
    truth = exact.search(queries, 10)
    got = approx.search(queries, 10)
    found = got.ids >= 0
    # any id returned is at its true distance
    for i in range(len(queries)):
        dist = (64 - db.astype(int) @ queries[i].astype(int)) // 2
        assert np.array_equal(got.distances[i][found[i]], dist[got.ids[i][found[i]]])
    # recall up to ties: a returned item counts when it lies within the true k-th distance
    recall = np.mean(found & (got.distances <= truth.distances[:, -1:]))
    if params.get("nprobe") == 16:  # all lists visited: the exact distances, ties in another order
        np.testing.assert_array_equal(got.distances, truth.distances)
    else:
        assert 0.3 < recall <= 1.0


def test_remove_and_upsert():
    rng = np.random.default_rng(3)
    db = _codes(rng, 50, 32)
    for description in ("BFlat", "BIVF4", "BMultiHash4"):
        index = index_factory(32, description)
        index.add(db, np.arange(100, 150))
        assert index.remove([100, 101, 999]) == 2
        assert index.ntotal == 48 and 100 not in index.search(db[:1], 48).ids
        far = -db[5:6]  # all bits flipped: distance 32 from the old code
        index.upsert(far, [105])
        assert index.ntotal == 48
        hit = index.search(far, 1)
        assert hit.ids[0, 0] == 105 and hit.distances[0, 0] == 0
        with pytest.raises(HashIndexError, match="already in the index"):
            index.add(db[:1], [110])


def test_bad_arguments_are_clear_errors():
    index = BinaryIndex(32)
    index.add(np.ones((5, 32), np.int8))
    with pytest.raises(HashIndexError, match="larger than the 5 items"):
        index.search(np.ones((1, 32), np.int8), 6)
    with pytest.raises(HashIndexError, match=">= 1"):
        index.search(np.ones((1, 32), np.int8), 0)
    with pytest.raises(HashIndexError, match="bits"):
        index.search(np.ones((1, 16), np.int8), 1)
    with pytest.raises(HashIndexError, match="unique"):
        index.add(np.ones((2, 32), np.int8), [7, 7])
    with pytest.raises(HashIndexError, match="unknown index type"):
        index_factory(32, "HNSW32")
    with pytest.raises(HashIndexError, match="multiple of 8"):
        BinaryIndex(12)


@pytest.mark.parametrize(("description", "params"), [("BFlat", {}), ("BIVF8", {}), ("BMultiHash4", {}),
                                                     ("ScaNNBrute", {}), ("ScaNN", {"leaves_to_search": 2})])  # fmt: skip
def test_save_load_round_trip(tmp_path, description, params):
    # A loaded ScaNN index rebuilds its tree (search visits 2 of its 20 leaves), so the answers after
    # loading equal those before only if the build is deterministic.
    rng = np.random.default_rng(4)
    db, queries = _codes(rng, 200, 32), _codes(rng, 7, 32)
    index = index_factory(32, description, **params)
    index.add(db, np.arange(200) * 3)
    before = index.search(queries, 5)
    path = tmp_path / "idx"
    index.save(path, model_version="7", signature_fingerprint="abc")
    manifest = read_manifest(path)
    assert manifest["model"] == {"version": "7", "signature_fingerprint": "abc"}
    assert manifest["count"] == 200 and manifest["bits"] == 32 and manifest["id_dtype"] == "int64"
    loaded = load_index(path, expected_model_version="7")
    after = loaded.search(queries, 5)
    np.testing.assert_array_equal(before.distances, after.distances)
    np.testing.assert_array_equal(before.ids, after.ids)
    assert not list(tmp_path.glob(".idx*"))  # no staging directories left behind


def test_corrupt_and_unknown_indexes_are_refused(tmp_path):
    index = BinaryIndex(16)
    index.add(np.ones((4, 16), np.int8))
    path = tmp_path / "idx"
    index.save(path, model_version="1")
    with pytest.raises(IndexFormatError, match="built for model version '1', not '2'; rebuild the index from this model, or load the model"):
        load_index(path, expected_model_version="2")
    codes_file = path / "codes.npy"
    data = bytearray(codes_file.read_bytes())
    data[-1] ^= 0xFF
    codes_file.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="checksum mismatch for codes.npy"):
        load_index(path)
    index.save(path)  # atomic replace of the corrupted directory
    load_index(path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["format_version"] = 99
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="version 99 is not supported"):
        load_index(path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        load_index(path)
    with pytest.raises(IndexFormatError, match="no manifest.json"):
        load_index(tmp_path)


def test_load_index_checks_the_signature_fingerprint(tmp_path):
    index = BinaryIndex(16)
    index.add(np.ones((4, 16), np.int8))
    index.save(tmp_path / "idx", model_version="1", signature_fingerprint="fp-a")
    assert len(load_index(tmp_path / "idx", expected_model_version="1", expected_signature_fingerprint="fp-a")) == 4
    with pytest.raises(IndexFormatError, match="built for SavedModel signature fingerprint 'fp-a', not 'fp-b'; rebuild the "
                                               "index from this model, or load the model it was built with"):  # fmt: skip
        load_index(tmp_path / "idx", expected_model_version="1", expected_signature_fingerprint="fp-b")
    index.save(tmp_path / "unchecked")  # records neither a model version nor a fingerprint
    assert len(load_index(tmp_path / "unchecked")) == 4  # nothing expected: nothing to check
    with pytest.raises(IndexFormatError, match="records no SavedModel signature fingerprint, so it cannot be checked "
                                               "against 'fp-a'; rebuild .* save it with signature_fingerprint='fp-a'"):  # fmt: skip
        load_index(tmp_path / "unchecked", expected_signature_fingerprint="fp-a")
    with pytest.raises(IndexFormatError, match="records no model version, so it cannot be checked against '1'"):
        load_index(tmp_path / "unchecked", expected_model_version=1)


def test_the_search_service_runs_the_same_check(monkeypatch):
    """``check_fingerprint`` refuses with :func:`check_model`'s message, and compares only when
    the manifest records a fingerprint and the model folder is visible (what it serves today)."""
    from tfhash.serving import versions

    monkeypatch.setattr(versions, "model_fingerprint", lambda model_dir: {"models/1": "fp-b"}.get(model_dir))
    manifest = {"model": {"version": "1", "signature_fingerprint": "fp-a"}}
    with pytest.raises(IndexFormatError) as served:
        versions.check_fingerprint("idx", manifest, "models/1")
    with pytest.raises(IndexFormatError) as loaded:
        check_model("idx", manifest, expected_signature_fingerprint="fp-b")
    assert str(served.value) == str(loaded.value) and "'fp-a', not 'fp-b'" in str(served.value)
    assert versions.check_fingerprint("idx", manifest, None) == "fp-a"  # the model folder is not visible here
    assert versions.check_fingerprint("idx", {"model": {"version": "1", "signature_fingerprint": None}}, "models/1") == "fp-b"


def _written(row) -> str:
    """How a user writes the table row ``row`` (a small number where it takes one)."""
    return f"{row.name}8" if row.size_param else row.name


def _make(bits: int, row, tmp_path, collection: str = "items"):
    """An empty index of the table row ``row``; a Milvus one in a Milvus Lite file under ``tmp_path``."""
    where = {"uri": str(tmp_path / "milvus.db"), "collection": collection} if row.cls is MilvusIndex else {}
    return index_factory(bits, _written(row), **where)


# The format tags and method params keys of format version 1, as written on disk by every
# tfhash since; they must not change, or saved indexes stop loading.
FORMAT_1 = {"BFlat": ("binary-flat", "kind"), "BIVF": ("binary-ivf", "kind"), "BMultiHash": ("binary-multihash", "kind"),
            "BMIH": ("binary-mih", "kind"), "ScaNN": ("scann-ah", "mode"), "ScaNNBrute": ("scann-brute", "mode"), "Milvus": ("milvus-flat", "method")}  # fmt: skip


@pytest.mark.process
def test_one_type_table_for_factory_and_loader(tmp_path):
    assert set(INDEX_TYPES) == set(FORMAT_1)
    assert len(FORMAT_TAGS) == len(INDEX_TYPES)  # one format tag per index type
    codes = _codes(np.random.default_rng(8), 40, 32)
    for name, row in INDEX_TYPES.items():
        index = _make(32, row, tmp_path)
        assert type(index) is row.cls and index.method == row.method and index.format_tag == row.format_tag
        index.add(codes, np.arange(40) + 1000)
        index.save(tmp_path / name)
        manifest = read_manifest(tmp_path / name)
        tag, method_key = FORMAT_1[name]
        assert manifest["kind"] == tag and manifest["params"][method_key] == row.method
        loaded = load_index(tmp_path / name)
        assert type(loaded) is row.cls and loaded.format_tag == tag and loaded.params() == index.params()
        np.testing.assert_array_equal(loaded.ids(), index.ids())
        index.close()
        loaded.close()
    manifest = json.loads((tmp_path / "BFlat" / "manifest.json").read_text())
    manifest["kind"] = "binary-hnsw"
    (tmp_path / "BFlat" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="unknown index format tag 'binary-hnsw'.*binary-flat"):
        load_index(tmp_path / "BFlat")


def test_index_type_spelling_errors_name_the_fix():
    with pytest.raises(HashIndexError, match="BIVF needs its nlist after the name, e.g. BIVF16"):
        index_factory(32, "BIVF")
    with pytest.raises(HashIndexError, match="BFlat takes no number"):
        index_factory(32, "BFlat8")
    with pytest.raises(HashIndexError, match=r"unknown index type 'IVF-PQ'; use BFlat, BIVF<nlist>"):
        index_factory(32, "IVF-PQ")
    with pytest.raises(HashIndexError, match="unknown BinaryIndex method 'hnsw'; choose one of flat, ivf, multihash"):
        BinaryIndex(32, "hnsw")


def test_capabilities_are_declared_and_refused_clearly():
    codes = _codes(np.random.default_rng(9), 30, 16)
    binary, scann = index_factory(16, "BFlat"), index_factory(16, "ScaNNBrute")
    assert binary.supports(TRAIN) and binary.supports(RANGE_SEARCH)
    assert not scann.supports(TRAIN) and not scann.supports(RANGE_SEARCH)
    for row in INDEX_TYPES.values():  # every index of a class declares the class's capabilities
        assert row.cls.capabilities <= {TRAIN, RANGE_SEARCH}
    binary.add(codes)
    binary.train(codes)  # a flat index needs no training: accepted, nothing changes
    assert len(binary.range_search(codes[:2], 0)) == 2
    scann.add(codes)
    with pytest.raises(HashIndexError, match=r"scann-brute index \(ScannIndex\) has no range_search capability \(it has: none\)"):
        scann.range_search(codes[:2], 3)
    with pytest.raises(HashIndexError, match="has no train capability.*index.supports\\('train'\\)"):
        scann.train(codes)
    with pytest.raises(HashIndexError, match="radius must be >= 0, got -1"):
        binary.range_search(codes[:2], -1)


@pytest.mark.parametrize("name", EVERY_INDEX_TYPE)
def test_automatic_ids_and_duplicates_for_every_index_type(name, tmp_path):
    codes = _codes(np.random.default_rng(10), 300, 32)  # enough for the ScaNN tree's training
    index = _make(32, INDEX_TYPES[name], tmp_path)
    index.add(codes[:200])  # automatic ids 0..199
    index.add(codes[200:202], [500, 250])
    index.add(codes[202:204])  # automatic ids continue after the largest: 501, 502
    inserted = [*range(200), 500, 250, 501, 502]  # every index but Milvus keeps insertion order; Milvus lists ids ascending
    assert index.ids().tolist() == (sorted(inserted) if isinstance(index, MilvusIndex) else inserted)
    with pytest.raises(HashIndexError, match=r"ids \[250\] are already in the index; use upsert"):
        index.add(codes[204:206], [600, 250])
    with pytest.raises(HashIndexError, match=r"ids must be unique; repeated: \[7\]"):
        index.add(codes[204:206], [7, 7])
    with pytest.raises(HashIndexError, match="expected 2 ids"):
        index.add(codes[204:206], [1])
    # -1 marks "nothing found" in a result, so a negative id would vanish from every answer
    with pytest.raises(HashIndexError, match=r"ids must be >= 0 .*got \[-1\]"):
        index.upsert(codes[204:206], [250, -1])
    with pytest.raises(HashIndexError):
        index.upsert(codes[204:206, :2], [250, 600])  # codes of the wrong width
    assert 250 in index.ids().tolist()  # a refused upsert removed nothing
    assert index.ntotal == 204  # a refused add leaves the index as it was
    assert index.remove([502, 501]) == 2
    index.add(codes[204:205])
    assert index.ids().max() == 501 and index.ntotal == 203
    hit = index.search(codes[204:205], 1)
    assert hit.distances[0, 0] == 0
    index.close()


@pytest.mark.parametrize("name", EVERY_INDEX_TYPE)
def test_search_unpacks_like_faiss_and_len_counts_for_every_index_type(name, tmp_path):
    codes = _codes(np.random.default_rng(11), 300, 32)  # enough for the ScaNN tree's training
    index = _make(32, INDEX_TYPES[name], tmp_path)
    try:
        assert len(index) == 0 and not index
        index.add(codes)
        assert len(index) == index.ntotal == 300
        result = index.search(codes[:3], 5)
        distances, ids = result  # FAISS's order: distances, then ids
        assert distances is result.distances and ids is result.ids and ids.shape == distances.shape == (3, 5)
        assert np.all(distances[:, 0] == 0) and ids[:, 0].tolist() == [0, 1, 2]  # each query finds itself first
        if index.supports(RANGE_SEARCH):
            for query, found in enumerate(index.range_search(codes[:2], 4)):  # one result per query
                near, near_ids = found
                assert near is found.distances and near_ids is found.ids and near_ids[0] == query
        index.remove([0, 1])
        assert len(index) == 298
    finally:
        index.close()


@pytest.mark.process
def test_missing_backend_names_the_extra(monkeypatch):
    extras = Path(__file__).resolve().parents[1].joinpath("pyproject.toml").read_text()
    line = next(x for x in extras.splitlines() if x.startswith(f"{BACKEND_EXTRA} = ["))
    assert all(package in line for package in BACKEND_PACKAGES.values())
    for module, name in (("faiss", "BIVF16"), ("faiss", "BMultiHash4"), ("scann", "ScaNN"), ("pymilvus", "Milvus")):
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, module, None)  # what Python does for a module that is not installed
            with pytest.raises(ImportError, match=rf'needs the optional package {BACKEND_PACKAGES[module]} .*pip install "tfhash\[index\]"'):
                index_factory(16, name)
    # `import tfhash.index` itself needs neither back-end, and the exact BFlat runs without them
    script = ("import sys; sys.modules['faiss'] = sys.modules['scann'] = sys.modules['pymilvus'] = None\n"
              "import numpy as np, tfhash, tfhash.index\n"
              "flat = tfhash.index.index_factory(16, 'BFlat'); flat.add(np.zeros((3, 2), np.uint8))\n"
              "print(flat.search(np.zeros((1, 2), np.uint8), 2).ids.tolist())\n"
              "try:\n    tfhash.index.index_factory(16, 'BIVF16')\nexcept ImportError as err:\n    print(err)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[0] == "[[0, 1]]"
    assert 'pip install "tfhash[index]"' in out.stdout


def test_scann_brute_force_on_signs_is_exact_hamming():
    rng = np.random.default_rng(5)
    db, queries = _codes(rng, 500, 32), _codes(rng, 10, 32)
    index = index_factory(32, "ScaNNBrute")
    index.add(db)
    result = index.search(queries, 20)
    expected_d, _ = _reference(db, np.arange(500), queries, 20)
    np.testing.assert_allclose(result.distances, expected_d)
    for i in range(10):  # every returned id sits at the reported distance (ties in any order)
        dist = (32 - db.astype(int) @ queries[i].astype(int)) // 2
        np.testing.assert_array_equal(dist[result.ids[i]], result.distances[i])


def test_scann_tree_ah_recall_and_asymmetric_queries():
    rng = np.random.default_rng(6)
    centres = _codes(rng, 10, 32)
    db = _codes(rng, 3000, 32, centres)
    queries = _codes(rng, 20, 32, centres)
    index = index_factory(32, "ScaNN", num_leaves=30, leaves_to_search=10)
    index.add(db)
    truth = index_factory(32, "BFlat")
    truth.add(db)
    got, exact = index.search(queries, 10), truth.search(queries, 10)
    kth = exact.distances[:, -1:]
    # recall up to ties: a returned item counts when it is within the true k-th distance
    assert np.mean(got.distances <= kth) > 0.8
    continuous = queries * rng.uniform(0.5, 1.5, queries.shape)  # float queries, binary database
    asym = index_factory(32, "ScaNNBrute")
    asym.add(db)
    result = asym.search(continuous, 5)
    scores = continuous @ db.T.astype(float)
    np.testing.assert_allclose(result.distances, (32 - np.sort(scores, axis=1)[:, ::-1][:, :5]) / 2, rtol=1e-4)


def test_pure_tf_search_matches_flat_and_exports_stock_ops(tmp_path):
    rng = np.random.default_rng(7)
    db, queries = _codes(rng, 1000, 16), _codes(rng, 6, 16)
    ids = np.arange(1000) + 500
    flat = BinaryIndex(16)
    flat.add(db, ids)
    module = HammingTopK(pack_codes(db), ids, chunk_size=128)  # 8 chunks, many ties across chunks
    out = module.search(tf.constant(pack_codes(queries)), tf.constant(40))
    expected = flat.search(queries, 40)
    np.testing.assert_array_equal(out["distances"].numpy(), expected.distances)
    np.testing.assert_array_equal(out["ids"].numpy(), expected.ids)
    export_hamming_search(pack_codes(db), ids, tmp_path / "sm", chunk_size=128)
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    served = loaded.signatures["serving_default"](queries=tf.constant(pack_codes(queries)), k=tf.constant(40))
    np.testing.assert_array_equal(served["ids"].numpy(), expected.ids)
    from tests.test_semantic_cluster_models import _stock_ops_only

    assert _stock_ops_only(tmp_path / "sm") == set()
    with pytest.raises(tf.errors.InvalidArgumentError, match="database size"):
        loaded.signatures["serving_default"](queries=tf.constant(pack_codes(queries)), k=tf.constant(1001))
