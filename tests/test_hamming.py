"""The compiled exact Hamming kernels (tfhash.hamming) against FAISS's IndexBinaryFlat, the
reference: the same distances and the same ids, ties included (insertion order)."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from tfhash.codes import hamming_distances
from tfhash.hamming import TILE, code_words, knn_search, knn_ties_search, range_search, set_threads
from tfhash.index import index_factory


def _random(rng, n, bits):
    return rng.integers(0, 256, (n, bits // 8), dtype=np.uint8)


def _clustered(rng, n, bits, centres=4, flips=2):
    """Codes a few bits away from a handful of centres: many equal distances."""
    unpacked = rng.integers(0, 2, (centres, bits), dtype=np.uint8)[rng.integers(0, centres, n)]
    for _ in range(flips):
        unpacked[np.arange(n), rng.integers(0, bits, n)] ^= 1
    return np.packbits(unpacked, axis=1)


def _faiss_knn(db, queries, k):
    index = faiss.IndexBinaryFlat(db.shape[1] * 8)
    index.use_heap = False
    index.add(db)
    return index.search(queries, k)


@pytest.mark.parametrize("bits", [8, 24, 48, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("kind", ["random", "clustered"])
def test_knn_equals_faiss_with_ties(bits, kind):
    rng = np.random.default_rng(bits)
    make = _random if kind == "random" else _clustered
    db = make(rng, 3000, bits)
    db[1500:2000] = db[:500]  # exact duplicates later in the database
    for m in (1, 3, 37):
        queries = np.concatenate([db[:1], make(rng, m - 1, bits)]) if m > 1 else db[:1]
        for k in (1, 10, 100, 3000):
            expected_d, expected_i = _faiss_knn(db, queries, k)
            for threads in (1, 2, 5):
                distances, positions = knn_search(queries, db, k, threads=threads)
                np.testing.assert_array_equal(distances, expected_d, err_msg=f"m={m} k={k} threads={threads}")
                np.testing.assert_array_equal(positions, expected_i, err_msg=f"m={m} k={k} threads={threads}")


def test_knn_across_tiles_and_all_ties():
    """More rows than one tile, and a database of one repeated code: the first k rows win."""
    rng = np.random.default_rng(1)
    db = _clustered(rng, TILE + 5000, 64, centres=2, flips=1)
    queries = _random(rng, 4, 64)
    for k in (5, 300):
        np.testing.assert_array_equal(knn_search(queries, db, k)[1], _faiss_knn(db, queries, k)[1])
    same = np.repeat(db[:1], 1000, axis=0)
    distances, positions = knn_search(same[:2], same, 50)
    np.testing.assert_array_equal(positions, np.tile(np.arange(50), (2, 1)))
    assert not distances.any()


@pytest.mark.parametrize("bits", [16, 48, 64, 96, 128])
def test_range_search_equals_faiss(bits):
    rng = np.random.default_rng(2)
    db = _clustered(rng, 2000, bits, flips=3)
    queries = np.concatenate([db[:3], _random(rng, 3, bits)])
    index = faiss.IndexBinaryFlat(bits)
    index.add(db)
    for radius in (0, 3, bits // 2):
        limits, expected_d, expected_i = index.range_search(queries, radius + 1)  # FAISS: d < radius
        for threads in (1, 2):
            offsets, distances, positions = range_search(queries, db, radius, threads=threads)
            for i in range(len(queries)):
                d, p = expected_d[limits[i] : limits[i + 1]], expected_i[limits[i] : limits[i + 1]]
                order = np.lexsort((p, d))
                np.testing.assert_array_equal(distances[offsets[i] : offsets[i + 1]], d[order])
                np.testing.assert_array_equal(positions[offsets[i] : offsets[i + 1]], p[order])


@pytest.mark.parametrize("bits", [16, 48, 64, 96, 128])
def test_knn_with_ties_is_the_knn_and_every_item_tied_with_the_kth(bits):
    """One pass (:func:`knn_ties_search`) against FAISS's k-NN distances and a range search to each
    query's k-th: the same rows, nearest first, ties in database order, on one thread or split in
    parts; large tie groups grow the candidate buffer past its first size."""
    rng = np.random.default_rng(4)
    db = np.concatenate([_clustered(rng, 5000, bits, centres=3, flips=1), _random(rng, 3000, bits)])
    queries = np.concatenate([db[:3], db[-2:], _random(rng, 2, bits)])
    index = faiss.IndexBinaryFlat(bits)
    index.add(db)
    for k in (1, 10, 700):
        kth = _faiss_knn(db, queries, k)[0][:, k - 1]
        for threads in (1, 2):
            offsets, distances, positions = knn_ties_search(queries, db, k, threads=threads)
            for i in range(len(queries)):
                limits, d, p = index.range_search(queries[i : i + 1], int(kth[i]) + 1)  # FAISS: d < radius
                order = np.lexsort((p, d))
                np.testing.assert_array_equal(distances[offsets[i] : offsets[i + 1]], d[order])
                np.testing.assert_array_equal(positions[offsets[i] : offsets[i + 1]], p[order])
    repeated = np.concatenate([db, np.repeat(db[:1], 500, axis=0)])  # a tie group larger than the first buffer (2k + 64)
    for threads in (1, 2):
        offsets, distances, positions = knn_ties_search(db[:1], repeated, 1, threads=threads)
        np.testing.assert_array_equal(positions, np.flatnonzero((repeated == db[0]).all(axis=1)))
        assert offsets[1] > 500 and not distances.any()
    with pytest.raises(ValueError, match=r"k must be an integer in 1\.\.8000"):
        knn_ties_search(queries, db, 8001)


def test_word_views_and_distances():
    rng = np.random.default_rng(3)
    for width, dtype in ((8, np.uint64), (16, np.uint64), (12, np.uint32), (6, np.uint16), (3, np.uint8)):
        packed = rng.integers(0, 256, (5, width), dtype=np.uint8)
        words = code_words(packed)
        assert words.dtype == dtype and words.nbytes == packed.nbytes
        d, _ = knn_search(packed, packed, 5)
        np.testing.assert_array_equal(d, np.sort(hamming_distances(packed, packed), axis=1))
    with pytest.raises(ValueError, match="must both hold 64-bit codes"):
        knn_search(_random(rng, 2, 32), _random(rng, 5, 64), 1)


def test_bad_arguments_are_clear_errors():
    rng = np.random.default_rng(7)
    db, queries = _random(rng, 10, 64), _random(rng, 2, 64)
    for k in (0, 11, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"k must be an integer in 1\.\.10"):
            knn_search(queries, db, k)
    with pytest.raises(ValueError, match="queries must be packed codes, a 2-D uint8 array"):
        knn_search(np.ones((2, 64), np.int8), db, 1)  # +-1 codes, not packed
    with pytest.raises(ValueError, match="database must be packed codes"):
        knn_search(queries, db[0], 1)
    for radius in (-1, 1.5):
        with pytest.raises(ValueError, match="radius must be an integer >= 0"):
            range_search(queries, db, radius)


def test_flat_index_uses_the_kernel_and_holds_only_the_codes():
    rng = np.random.default_rng(4)
    db = _clustered(rng, 5000, 64)
    ids = rng.permutation(10**6)[:5000].astype(np.int64)
    index = index_factory(64, "BFlat")
    index.add(db, ids)
    queries = _random(rng, 9, 64)
    expected_d, expected_i = _faiss_knn(db, queries, 20)
    result = index.search(queries, 20)
    np.testing.assert_array_equal(result.distances, expected_d)
    np.testing.assert_array_equal(result.ids, ids[expected_i])
    assert index._faiss is None and index._rows.nbytes == db.nbytes


def test_threads_setting():
    """``set_threads(1)``: every search on the calling thread (what the search service uses);
    the answers do not change."""
    rng = np.random.default_rng(6)
    db, queries = _random(rng, 2000, 64), _random(rng, 4, 64)
    expected = knn_search(queries, db, 7)
    try:
        set_threads(1)
        for got, want in zip(knn_search(queries, db, 7), expected, strict=True):
            np.testing.assert_array_equal(got, want)
    finally:
        set_threads(0)
    with pytest.raises(ValueError, match="threads must be an int >= 0"):
        set_threads(-1)


def test_read_only_queries_reuse_the_compiled_kernels():
    """Queries decoded from a request's bytes (``np.frombuffer``) are read-only; numba would compile
    every kernel again for them, seconds that a first request's deadline does not have."""
    from tfhash import hamming

    rng = np.random.default_rng(8)
    db, queries = _random(rng, 300, 64), _random(rng, 3, 64)
    kernels = (hamming._knn_serial, hamming._knn_parallel, hamming._range_serial, hamming._range_parallel)
    for threads in (1, 2):
        knn_search(queries, db, 4, threads=threads)
        range_search(queries, db, 20, threads=threads)
    compiled = [len(kernel.signatures) for kernel in kernels]
    read_only = np.frombuffer(queries.tobytes(), np.uint8).reshape(queries.shape)
    assert not read_only.flags.writeable
    for threads in (1, 2):
        for got, want in zip(knn_search(read_only, db, 4, threads=threads), knn_search(queries, db, 4, threads=threads), strict=True):
            np.testing.assert_array_equal(got, want)
        for got, want in zip(range_search(read_only, db, 20, threads=threads), range_search(queries, db, 20, threads=threads), strict=True):
            np.testing.assert_array_equal(got, want)
    assert [len(kernel.signatures) for kernel in kernels] == compiled
