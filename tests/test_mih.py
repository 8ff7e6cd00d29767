"""BMIH, exact multi-index hashing: the same answers as BFlat on every query, its tables, adds in
segments, files mapped and linked, and bad input."""

from __future__ import annotations

import hashlib
import json
import os
import tracemalloc

import numpy as np
import pytest

from tfhash.hamming import knn_search, knn_ties_search, range_search
from tfhash.index import (
    HashIndexError,
    IndexFormatError,
    MultiIndexHashing,
    index_factory,
    load_index,
    read_manifest,
)
from tfhash.index import mih as mih_index
from tfhash.mih import (
    build_tables,
    default_key_bits,
    default_tables,
    mih_knn,
    mih_knn_ties,
    mih_range,
    pack_positions,
    packed_words,
    position_bits,
    substring_starts,
    unpack_positions,
)


def clustered(rng, n, bits, centres=20, flip=0.125, ties=0):
    """Packed codes around random centres (each bit flipped with probability ``flip``); the first
    ``ties`` rows are copies of one code."""
    middle = rng.integers(0, 2, (centres, bits))
    codes = middle[rng.integers(0, centres, n)] ^ (rng.random((n, bits)) < flip)
    codes[:ties] = codes[0]
    return np.packbits(codes, axis=1)


def assert_same(got, expected):
    np.testing.assert_array_equal(got.distances, expected.distances)
    np.testing.assert_array_equal(got.ids, expected.ids)


@pytest.mark.parametrize("bits", [16, 40, 48, 64, 128])
@pytest.mark.parametrize("tables", [1, 2, 3])
def test_the_kernel_answers_as_the_linear_scan(bits, tables):
    """Every distance, position and tie order equal to tfhash.hamming's scan, for k-NN (k from 1 to
    every row) and range search, with ties larger than k and queries far from every code."""
    rng = np.random.default_rng(bits + tables)
    db = clustered(rng, 3000, bits, ties=700)
    queries = np.concatenate([clustered(rng, 20, bits), db[:3], np.packbits(rng.integers(0, 2, (5, bits)), axis=1)])
    starts = substring_starts(bits, tables)
    key_bits = default_key_bits(bits, tables, len(db))
    offsets, positions = build_tables(db, starts, key_bits)
    for k in (1, 10, 701, 3000):
        distances, found, finished = mih_knn(queries, db, starts, key_bits, offsets, positions, k, 10**12)
        expected_d, expected_p = knn_search(queries, db, k)
        assert finished.all()
        np.testing.assert_array_equal(distances, expected_d)
        np.testing.assert_array_equal(found, expected_p)
    found_by = [(mih_knn_ties, knn_ties_search, k) for k in (1, 10, 701)] + [(mih_range, range_search, r) for r in (0, 2, bits // 4)]
    for ours, scan, value in found_by:  # the k nearest with their ties, and every row within a radius
        answers, finished = ours(queries, db, starts, key_bits, offsets, positions, value, 10**12)
        limits, expected_d, expected_p = scan(queries, db, value)
        assert finished.all()
        for q, (d, p) in enumerate(answers):
            np.testing.assert_array_equal(d, expected_d[limits[q] : limits[q + 1]])
            np.testing.assert_array_equal(p, expected_p[limits[q] : limits[q + 1]])


def test_the_tables_list_every_row_once_in_insertion_order_per_bucket():
    rng = np.random.default_rng(0)
    db = clustered(rng, 500, 32)
    starts = substring_starts(32, 3)
    assert starts.tolist() == [0, 11, 22]  # 11, 11 and 10 bits
    offsets, packed = build_tables(db, starts, 10)
    assert packed.dtype == np.uint64 and packed.shape == (3, (500 * 9 + 63) // 64 + 1)  # 9 bits a position
    positions = unpack_positions(packed, 500)
    bits = np.unpackbits(db, axis=1)
    for t, start in enumerate(starts):
        keys = bits[:, start : start + 10] @ (1 << np.arange(9, -1, -1))
        assert sorted(positions[t].tolist()) == list(range(500))
        np.testing.assert_array_equal(positions[t], np.argsort(keys, kind="stable"))
        np.testing.assert_array_equal(offsets[t], np.searchsorted(np.sort(keys), np.arange(1025)))


@pytest.mark.parametrize("count", [1, 2, 3, 64, 65, 1000, 2**20 + 1])
def test_positions_are_packed_at_the_fewest_bits_and_read_back(count):
    """ceil(log2(count)) bits a position (27 at 100M), across word boundaries, the largest value too."""
    width = position_bits(count)
    assert width == max(1, int(np.ceil(np.log2(count))))
    rng = np.random.default_rng(count)
    rows = rng.integers(0, count, (2, count)).astype(np.uint32)
    rows[:, -1] = count - 1
    packed = pack_positions(rows)
    assert packed.shape == (2, packed_words(count)) and packed_words(count) == (count * width + 63) // 64 + 1
    np.testing.assert_array_equal(unpack_positions(packed, count), rows)
    assert position_bits(100_000_000) == 27 and position_bits(2**27) == 27 and position_bits(2**27 + 1) == 28


def test_the_number_of_tables_follows_the_paper_and_is_bounded():
    assert default_tables(64, 100_000_000) == 3 and default_tables(64, 1_000_000) == 4 and default_tables(128, 10_000_000) == 6
    assert default_tables(64, 10) == 8 and default_tables(16, 1) == 2  # substrings of at least 8 bits
    assert default_key_bits(64, 2, 100_000_000) == 24 and default_key_bits(64, 3, 100_000_000) == 21
    assert default_key_bits(64, 3, 1_000_000) == 18
    with pytest.raises(ValueError, match="tables must be in 1..16"):
        substring_starts(16, 17)


def test_a_query_that_costs_more_than_a_scan_is_handed_to_the_scan():
    rng = np.random.default_rng(1)
    db = np.packbits(rng.integers(0, 2, (20000, 64)), axis=1)  # uniform: the 10th neighbour lies far
    queries = np.packbits(rng.integers(0, 2, (4, 64)), axis=1)
    starts = substring_starts(64, 3)
    offsets, positions = build_tables(db, starts, 12)
    _, _, finished = mih_knn(queries, db, starts, 12, offsets, positions, 10, 200)
    assert not finished.any()
    index = MultiIndexHashing(64)
    index.add(db)
    flat = index_factory(64, "BFlat")
    flat.add(db)
    assert_same(index.search(queries, 10), flat.search(queries, 10))  # scanned, the same answers
    for ours, theirs in zip(index.search_with_ties(queries, 10), flat.search_with_ties(queries, 10), strict=True):
        assert_same(ours, theirs)


def test_a_query_gives_up_early_when_the_probes_still_needed_pass_its_limit():
    """The probes of the steps after (rho, t) up to the first covering the target distance: after
    key distance 1 in both of 2 tables of 24-bit keys, covering 12 needs key distances 2..5 in both
    and 6 in the first; the count stops once it passes the most it may spend."""
    from math import comb

    from tfhash.mih import _probes_ahead

    expected = 2 * sum(comb(24, r) for r in range(2, 6)) + comb(24, 6)
    assert _probes_ahead(2, 24, 1, 1, 12, 1e12) == expected
    assert _probes_ahead(2, 24, 1, 1, 5, 1e12) == 2 * comb(24, 2)  # (2, 1) covers 2 * 2 + 1 = 5
    assert _probes_ahead(2, 24, 1, 1, 12, 1000) < 2 * comb(24, 2) + 2 * comb(24, 3)  # stopped past 1000
    assert _probes_ahead(3, 8, 8, 2, 30, 1e12) == 0  # every key distance done: nothing ahead


@pytest.mark.parametrize("tables", [None, 2])
def test_bmih_answers_as_bflat_through_adds_removals_and_upserts(tables):
    rng = np.random.default_rng(2)
    db = clustered(rng, 4900, 64, ties=300)
    ids = rng.permutation(100_000)[:4900]
    queries = np.concatenate([clustered(rng, 15, 64), db[:2]])
    index, flat = index_factory(64, "BMIH", tables=tables), index_factory(64, "BFlat")
    assert index.exact and index.format_tag == "binary-mih"
    for part in (slice(0, 4000), slice(4000, 4100), slice(4100, 4200), slice(4200, 4900)):  # a big segment, then small adds
        index.add(db[part], ids[part])
        flat.add(db[part], ids[part])
        assert index.ntotal == flat.ntotal and index.ids().tolist() == flat.ids().tolist()
        for k in (1, 10, 400):
            assert_same(index.search(queries, k), flat.search(queries, k))
    assert [s.count for s in index.segments] == [4000, 900]  # the small adds merged, the first segment kept
    for ours, theirs in zip(index.range_search(queries, 6), flat.range_search(queries, 6), strict=True):
        assert_same(ours, theirs)
    for k in (1, 5, 301, 400):
        for ours, theirs in zip(index.search_with_ties(queries, k), flat.search_with_ties(queries, k), strict=True):
            assert_same(ours, theirs)
    gone = ids[[0, 4050, 4899]]
    assert index.remove(gone) == flat.remove(gone) == 3
    index.upsert(db[10:12], ids[[0, 4050]])
    flat.upsert(db[10:12], ids[[0, 4050]])
    assert_same(index.search(queries, 10), flat.search(queries, 10))
    index.add(db[:5])  # automatic ids after the largest
    assert index.ids()[-5:].tolist() == list(range(int(ids.max()) + 1, int(ids.max()) + 6))


def test_adding_to_a_saved_index_writes_only_the_new_segment(tmp_path):
    """A loaded (mapped) index takes an add as a segment of its own; saved as a new version, the old
    segment's files are links to the first version's, and both versions verify and answer as a
    BMIH built whole."""
    rng = np.random.default_rng(3)
    db = clustered(rng, 5000, 64)
    queries = clustered(rng, 10, 64)
    index = MultiIndexHashing(64)
    index.add(db[:4500])
    index.save(tmp_path / "v1", model_version="1")
    loaded = load_index(tmp_path / "v1", expected_model_version="1", mapped=True)
    assert isinstance(loaded.segments[0].codes, np.memmap)
    loaded.add(db[4500:])
    loaded.save(tmp_path / "v2", model_version="2")
    first, linked = tmp_path / "v1" / "segment-000" / "positions.npy", tmp_path / "v2" / "segment-000" / "positions.npy"
    assert os.stat(first).st_ino == os.stat(linked).st_ino  # the same file, not a copy
    assert [s["count"] for s in read_manifest(tmp_path / "v2")["params"]["segments"]] == [4500, 500]
    whole = MultiIndexHashing(64)
    whole.add(db)
    assert_same(load_index(tmp_path / "v2", mapped=True).search(queries, 10), whole.search(queries, 10))
    assert_same(load_index(tmp_path / "v1").search(queries, 10), index.search(queries, 10))


def test_automatic_ids_are_kept_as_a_range_and_the_index_owns_its_codes(tmp_path):
    """Consecutive ids (automatic ones) cost no array: a segment keeps its first id, writes no ids
    file, and holds its codes and tables alone; two ranges that meet merge into one; a removal in
    the middle, or ids out of order, keep an array. The index copies the codes it is given."""
    rng = np.random.default_rng(5)
    db = clustered(rng, 6000, 64)
    queries = clustered(rng, 10, 64)
    given = db[:4000].copy()
    index, flat = MultiIndexHashing(64), index_factory(64, "BFlat")
    index.add(given)
    given[:] = 0  # the caller's array changes; the index's copy does not
    flat.add(db[:4000])
    assert_same(index.search(queries, 10), flat.search(queries, 10))
    (segment,) = index.segments
    assert segment.ids is None and segment.first_id == 0
    assert sum(a.nbytes for a in segment.files().values()) == db[:4000].nbytes + segment.offsets.nbytes + segment.positions.nbytes
    for added in (db[4000:5000], db[5000:5100]):  # the first merges into the range, the second stays a segment
        index.add(added)
        flat.add(added)
    assert [(s.count, s.ids is None, s.first_id) for s in index.segments] == [(5000, True, 0), (100, True, 5000)]
    index.add(db[5100:5200], np.arange(9000, 9100))  # a range that does not follow: merged, the ids become an array
    flat.add(db[5100:5200], np.arange(9000, 9100))
    assert [(s.count, s.ids is None) for s in index.segments] == [(5000, True), (200, False)]
    assert index.ids().tolist() == flat.ids().tolist()
    index.save(tmp_path / "idx")
    assert not (tmp_path / "idx" / "segment-000" / "ids.npy").exists()
    assert read_manifest(tmp_path / "idx")["params"]["segments"][0]["first_id"] == 0
    loaded = load_index(tmp_path / "idx", mapped=True)
    assert loaded.ids().tolist() == flat.ids().tolist()
    assert_same(loaded.search(queries, 20), flat.search(queries, 20))
    assert loaded.remove([10, 5050]) == flat.remove([10, 5050]) == 2  # a hole: the range becomes an array
    assert [s.ids is None for s in loaded.segments] == [False, False]
    assert_same(loaded.search(queries, 20), flat.search(queries, 20))
    loaded.add(db[:3])
    flat.add(db[:3])
    assert loaded.ids()[-3:].tolist() == flat.ids()[-3:].tolist() == [9100, 9101, 9102]
    shuffled = MultiIndexHashing(64)
    shuffled.add(db[:300], np.arange(300)[::-1])
    assert shuffled.segments[0].ids is not None


@pytest.mark.parametrize("kind", ["BMIH", "BFlat"])
def test_codes_added_in_batches_are_one_add_and_bmih_keeps_the_gathered_array(kind):
    """add_batches answers as one add of every batch (ids given or automatic); bad batches change
    nothing; BMIH holds the gathered codes without a second copy (traced allocations)."""
    rng = np.random.default_rng(7)
    db, queries = clustered(rng, 4000, 64), clustered(rng, 10, 64)
    batches = [(db[i : i + 1000], np.arange(i, i + 1000) * 3) for i in range(0, 4000, 1000)]
    whole, batched = index_factory(64, kind), index_factory(64, kind)
    whole.add(db, np.arange(4000) * 3)
    batched.add_batches(iter(batches), 4000)
    assert_same(batched.search(queries, 10), whole.search(queries, 10))
    automatic = index_factory(64, kind)
    automatic.add_batches(((codes, None) for codes, _ in batches), 4000)
    assert automatic.ids().tolist() == list(range(4000))
    refused = [
        (batches, 3999, "hold more than the 3999 codes announced"),
        (batches, 4001, "hold 4000 codes, 4001 were announced"),
        ([batches[0], (db[1000:2000], None)], 2000, "some batches carry ids and some do not"),
        ([(db[:10], np.arange(10) * 0.5)], 10, "carries ids of float64"),
        ([(db[:10], np.arange(10)), (db[10:20], np.arange(5, 15))], 20, "ids must be unique; repeated: \\[5, 6"),
        ([(db[:10], np.arange(10) * 3)], 10, "already in the index"),
        ([(db[:10, :4], None)], 10, "have 32 bits, the index holds 64-bit codes"),
    ]
    for given, count, message in refused:
        with pytest.raises(HashIndexError, match=message):
            batched.add_batches(iter(given), count)
        assert batched.ntotal == 4000
    assert_same(batched.search(queries, 10), whole.search(queries, 10))
    for count in (-1, 2.5, True):
        with pytest.raises(HashIndexError, match="count must be the number of codes"):
            batched.add_batches(iter(batches), count)
    if kind == "BMIH":
        big = clustered(rng, 200_000, 64)
        parts = [(big[i : i + 20_000], np.arange(i, i + 20_000) + 10**6) for i in range(0, 200_000, 20_000)]  # ids a range
        peaks = []
        for fill in (lambda index: index.add_batches(iter(parts), 200_000), lambda index: index.add(np.concatenate([p for p, _ in parts]), np.arange(200_000) + 10**6)):
            fill(MultiIndexHashing(64))  # compiled and warm: only the arrays are traced below
            tracemalloc.start()
            fill(MultiIndexHashing(64))
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        assert peaks[0] < peaks[1] - 0.9 * big.nbytes  # one copy of the codes fewer


def test_an_index_saved_with_uint32_positions_loads_and_is_saved_packed(tmp_path):
    """Segments written before positions were packed ((m, n) uint32) load, answer the same, and a
    save writes them packed (not linked from the old version)."""
    rng = np.random.default_rng(6)
    db, queries = clustered(rng, 3000, 64), clustered(rng, 10, 64)
    index = MultiIndexHashing(64)
    index.add(db)
    index.save(tmp_path / "old")
    folder = tmp_path / "old" / "segment-000"
    np.save(folder / "positions.npy", unpack_positions(index.segments[0].positions, 3000))
    manifest_path = tmp_path / "old" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["segment-000/positions.npy"] = hashlib.sha256((folder / "positions.npy").read_bytes()).hexdigest()
    manifest_path.write_text(json.dumps(manifest))
    loaded = load_index(tmp_path / "old", mapped=True)
    np.testing.assert_array_equal(loaded.segments[0].positions, index.segments[0].positions)
    assert_same(loaded.search(queries, 10), index.search(queries, 10))
    loaded.save(tmp_path / "new")
    assert np.load(tmp_path / "new" / "segment-000" / "positions.npy").dtype == np.uint64


def test_bad_input_and_damaged_files_are_refused(tmp_path):
    with pytest.raises(HashIndexError, match=r"tables must be an integer in 1..8 for 64-bit codes"):
        MultiIndexHashing(64, tables=9)
    with pytest.raises(HashIndexError, match="takes no number"):
        index_factory(64, "BMIH4")
    index = MultiIndexHashing(64)
    db = clustered(np.random.default_rng(4), 300, 64)
    index.add(db)
    with pytest.raises(HashIndexError, match="k = 301 is larger than the 300 items"):
        index.search(db[:1], 301)
    with pytest.raises(HashIndexError, match="have 32 bits, the index holds 64-bit codes"):
        index.search(db[:1, :4], 1)
    with pytest.raises(HashIndexError, match=r"ids \[250, 251, 252"):  # given ids that are a range, overlapping a range held
        index.add(db[:60], np.arange(250, 310))
    ranged = MultiIndexHashing(64)
    ranged.add(db[:50], np.arange(100, 150))  # given ids that are a range are kept as one, as automatic ones
    assert ranged.segments[0].ids is None and ranged.segments[0].first_id == 100
    scattered = MultiIndexHashing(64)
    scattered.add(db[:3], np.array([0, 55, 7]))
    with pytest.raises(HashIndexError, match=r"ids \[55\] are already"):  # a range around an id held
        scattered.add(db[:10], np.arange(50, 60))
    scattered.add(db[:10], np.arange(60, 70))
    assert scattered.ids().tolist() == [0, 55, 7, *range(60, 70)]
    with pytest.raises(ValueError, match=r"positions of 4 rows lie in 0..3, got 0..4"):
        pack_positions(np.array([[0, 1, 2, 4]], np.uint32))
    with pytest.raises(ValueError, match=r"k must be an integer in 1..300"):
        mih_knn_ties(db[:1], db, substring_starts(64, 2), 8, *build_tables(db, substring_starts(64, 2), 8), 0, 10**6)
    offsets = np.zeros((1, 257), np.uint32)
    offsets[0, -1] = 7
    damaged = mih_index.Segment(db, np.arange(300), 1, 8, offsets, np.zeros((1, packed_words(300)), np.uint64))
    with pytest.raises(IndexFormatError, match="offsets end at 7, not at the 300 items"):
        mih_index._check_segment(damaged, 64, "segment-000")
    index.save(tmp_path / "idx")
    (tmp_path / "idx" / "segment-000" / "codes.npy").write_bytes(b"broken")
    with pytest.raises(IndexFormatError, match="checksum mismatch for segment-000/codes.npy"):
        load_index(tmp_path / "idx")
