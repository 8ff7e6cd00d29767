"""The second stage of a search (tfhash.index.refine): candidates, their order, and the embeddings
stored in an index version."""

import json
import os

import numpy as np
import pytest

from tfhash.codes import hamming_distances, pack_codes, sign_codes
from tfhash.index import (
    Embeddings,
    HashIndexError,
    IndexFormatError,
    index_factory,
    load_embeddings,
    load_index,
    quantised_rows,
    refined_search,
)
from tfhash.index import refine as refine_module

BITS = 32


def collapsed(n: int = 600, seed: int = 0) -> np.ndarray:
    """Continuous codes where the first half shares one sign pattern (a collapsed class) and the
    rest are spread."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(n, BITS)).astype(np.float32)
    values[: n // 2] = np.abs(values[: n // 2]) + 0.05
    return values


def flat_index(values: np.ndarray, ids: np.ndarray):
    index = index_factory(BITS, "BFlat")
    index.add(sign_codes(values), ids)
    return index


def expected_order(query: np.ndarray, values: np.ndarray, ids: np.ndarray, k: int, k_factor: int) -> np.ndarray:
    """The definition, spelled out: the Hamming pool (insertion order among ties) widened to every
    item tied with the k-th, then cosine order (stable)."""
    distances = hamming_distances(pack_codes(sign_codes(query[None])), pack_codes(sign_codes(values)))[0]
    order = np.argsort(distances, kind="stable")
    pool = order[: min(len(ids), k * k_factor)]
    kth = distances[order[k - 1]]
    pool = np.union1d(pool, np.flatnonzero(distances <= kth)) if distances[pool[-1]] == kth else pool
    pool = pool[np.lexsort((pool, distances[pool]))]  # by distance, then insertion (the items' positions)
    rows = quantised_rows(values).astype(np.float64)
    similarity = rows[pool] @ quantised_rows(query[None]).astype(np.float64)[0] / np.linalg.norm(rows[pool], axis=1)
    return ids[pool[np.argsort(-similarity, kind="stable")[:k]]]


def test_each_item_comes_first_for_its_own_code_and_ties_past_the_pool_are_candidates():
    values = collapsed()
    ids = np.arange(len(values), dtype=np.int64) * 7 + 3
    index, stored = flat_index(values, ids), Embeddings.of(values, ids)
    refined = refined_search(index, stored, values, 5, k_factor=2)
    np.testing.assert_array_equal(refined.ids[:, 0], ids)  # every item first for itself, even inside the collapsed half
    hamming = index.search(sign_codes(values), 5)
    assert np.mean(hamming.ids[:300, 0] == ids[:300]) < 0.01  # Hamming order alone: insertion order among 300 ties
    for row in (0, 299, 300, 599):  # the pool of 10 cuts the 300 tied items: all of them are candidates
        np.testing.assert_array_equal(refined.ids[row], expected_order(values[row], values, ids, 5, 2))
    small = values.copy()
    small[:, 0] = -1e-6  # rounds to 0 in 8 bits; its sign still counts in the code
    found = refined_search(flat_index(small, ids), Embeddings.of(small, ids), small[:50], 3)
    assert np.all(found.distances[:, 0] == 0) and np.array_equal(found.ids[:, 0], ids[:50])
    # the distances are the candidates' Hamming distances
    for row in (0, 450):
        codes = pack_codes(sign_codes(values))
        np.testing.assert_array_equal(refined.distances[row], hamming_distances(codes[row : row + 1], codes)[0][(refined.ids[row] - 3) // 7])


def test_an_approximate_index_orders_its_own_candidates_and_k_is_checked():
    values = collapsed(400, seed=1)
    ids = np.arange(400, dtype=np.int64)
    index = index_factory(BITS, "BIVF4", nprobe=1)
    index.train(sign_codes(values))
    index.add(sign_codes(values), ids)
    stored = Embeddings.of(values, ids)
    found = refined_search(index, stored, values[:20], 3, k_factor=4)
    pool = index.search(sign_codes(values[:20]), 12)
    rows = stored.rows.astype(np.float64)
    for row in range(20):
        members = pool.ids[row][pool.ids[row] >= 0]
        assert set(found.ids[row][found.ids[row] >= 0]) <= set(members)
        answered = rows[found.ids[row][found.ids[row] >= 0]]
        assert np.all(np.diff(answered @ rows[row] / np.linalg.norm(answered, axis=1)) <= 1e-9)  # most similar first
    one = index_factory(BITS, "BFlat")
    one.add(sign_codes(values[:2]), ids[:2])
    with pytest.raises(HashIndexError, match="larger than the 2 items"):
        refined_search(one, Embeddings.of(values[:2], ids[:2]), values[:1], 3)


def test_embeddings_are_stored_checksummed_and_refused_when_they_do_not_match(tmp_path, monkeypatch):
    values = collapsed(200)
    ids = np.arange(200, dtype=np.int64) + 10
    index = flat_index(values, ids)
    stored = Embeddings.of(values[::-1], ids[::-1])  # any order in: kept by id
    np.testing.assert_array_equal(stored.ids, ids)
    path = tmp_path / "1" / "BFlat"
    index.save(path, model_version="1", embeddings=stored)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["embeddings"] == {"count": 200, "dim": BITS, "dtype": "int8", "scaled": "largest magnitude 127"}
    assert {"embeddings.npy", "embedding_ids.npy"} <= set(manifest["files"])
    loaded = load_embeddings(path, mapped=True)
    np.testing.assert_array_equal(loaded.rows, stored.rows)
    with monkeypatch.context() as patched:  # given the manifest load_index has verified, nothing is hashed again
        patched.setattr(refine_module, "verify_files", lambda *args: pytest.fail("the embeddings were hashed a second time"))
        np.testing.assert_array_equal(load_embeddings(path, manifest=manifest).rows, stored.rows)
    np.testing.assert_array_equal(refined_search(load_index(path), loaded, values, 3).ids,
                                  refined_search(index, stored, values, 3).ids)  # fmt: skip
    index.save(tmp_path / "plain", model_version="1")
    assert load_embeddings(tmp_path / "plain") is None  # an index without: Hamming order only
    with pytest.raises(HashIndexError, match="199 embeddings for an index of 200 items"):
        index.save(tmp_path / "short", embeddings=Embeddings.of(values[1:], ids[1:]))
    with pytest.raises(HashIndexError, match="not one per item"):
        index.save(tmp_path / "other", embeddings=Embeddings.of(values, ids + 1))
    assert not (tmp_path / "short").exists() and not (tmp_path / "other").exists()
    rows = np.load(path / "embeddings.npy")
    rows[5, 0] = -rows[5, 0]  # one flipped value, same size
    np.save(path / "embeddings.npy", rows, allow_pickle=False)
    for load in (load_embeddings, load_index):
        with pytest.raises(IndexFormatError, match="checksum mismatch for embeddings.npy"):
            load(path)
    os.remove(path / "embeddings.npy")
    with pytest.raises(IndexFormatError, match="embeddings.npy named by the manifest is missing"):
        load_embeddings(path)


def test_bad_queries_and_settings_are_refused_by_name():
    values = collapsed(50)
    ids = np.arange(50, dtype=np.int64)
    index, stored = flat_index(values, ids), Embeddings.of(values, ids)
    bad = values[:2].copy()
    bad[0, 3] = np.nan
    with pytest.raises(HashIndexError, match="queries contain NaN or infinity"):
        refined_search(index, stored, bad, 3)
    with pytest.raises(HashIndexError, match="embeddings contain NaN or infinity"):
        Embeddings.of(bad, ids[:2])
    with pytest.raises(HashIndexError, match="queries have 16 values per row; the index holds 32-bit codes"):
        refined_search(index, stored, values[:2, :16], 3)
    for k_factor in (0, 1.5, True):
        with pytest.raises(HashIndexError, match="k_factor must be an integer >= 1"):
            refined_search(index, stored, values[:2], 3, k_factor=k_factor)
    with pytest.raises(HashIndexError, match=r"ids \[49\] have codes in the index but no embedding"):
        refined_search(index, Embeddings.of(values[:49], ids[:49]), values[:1], 50)
    with pytest.raises(HashIndexError, match="must be a 2-D array of numbers"):
        quantised_rows(np.zeros(5))
    approximate = index_factory(BITS, "BIVF2")
    approximate.train(sign_codes(values))
    approximate.add(sign_codes(values), ids)
    with pytest.raises(HashIndexError, match="'ivf' is approximate: it cannot say which items tie with the k-th"):
        approximate.search_with_ties(sign_codes(values[:1]), 3)
    zero = quantised_rows(np.zeros((1, 4)))
    assert zero.dtype == np.int8 and not zero.any()  # a zero row stays zero (no division by zero)
    np.testing.assert_array_equal(quantised_rows([[0.5, -1.0, 0.25]]), [[64, -127, 32]])  # the largest magnitude to 127
