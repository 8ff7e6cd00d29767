"""``BMIH``: exact Hamming search in sublinear time by multi-index hashing (:mod:`tfhash.mih`),
in segments that adds append without rebuilding what is there."""

from __future__ import annotations

import functools
import os
import shutil
from dataclasses import dataclass

import numpy as np

from tfhash.hamming import knn_search, knn_ties_search, range_search
from tfhash.index.base import (
    IDS_FILE,
    PACKED,
    RANGE_SEARCH,
    HashIndex,
    HashIndexError,
    SearchResult,
)
from tfhash.index.persistence import IndexFormatError
from tfhash.mih import (
    build_tables,
    default_key_bits,
    default_tables,
    mih_knn,
    mih_knn_ties,
    mih_range,
    pack_positions,
    packed_words,
    substring_starts,
)

__all__ = ["MultiIndexHashing", "Segment"]

#: A query gives up the tables for a linear scan of a segment once its probes plus the items it
#: read pass this share of the segment's items. A unit of that work (a probe, or a random read of
#: a row) costs about a hundred rows of a linear scan (40 ns against 0.4 ns at 100M 64-bit codes,
#: AMD EPYC), so a query gives up once it has spent about a scan: never more than about twice a
#: scan, and the far tail of clustered codes (k-th neighbour at 9-10 of 64 bits) still finishes.
SCAN_SHARE = 1 / 100
#: An add merges the newest segment into the one before while it holds at least this share of it:
#: segments then grow geometrically, an add rebuilds at most a few times its own size (amortised),
#: and a collection of n items has at most about log4(n) segments.
MERGE_SHARE = 1 / 4
#: The arrays of a segment, in its folder (``ids.npy`` only when its ids are not a range).
SEGMENT_FILES = ("codes.npy", IDS_FILE, "offsets.npy", "positions.npy")
#: Ids are checked for being a range this many at a time (no copy of the whole array).
_RANGE_CHUNK = 1 << 20


@dataclass
class Segment:
    """Codes in insertion order with their tables (:func:`tfhash.mih.build_tables`), their ids, and
    the folder its arrays were read from (a save links them from there instead of writing them).

    Ids that are a range (automatic ids are) are kept as its first id alone, ``ids`` ``None``: an
    int64 array would weigh as much as 64-bit codes."""

    codes: np.ndarray
    ids: np.ndarray | None
    tables: int
    key_bits: int
    offsets: np.ndarray
    positions: np.ndarray
    source: str | None = None
    first_id: int = 0

    @classmethod
    def build(cls, codes: np.ndarray, ids: np.ndarray | int, bits: int, tables: int | None) -> Segment:
        """The segment of ``codes`` under ``ids`` (an array, or the first id of a range)."""
        m = tables or default_tables(bits, codes.shape[0])
        key_bits = default_key_bits(bits, m, codes.shape[0])
        first = ids if isinstance(ids, int) else _range_start(ids)
        offsets, positions = build_tables(codes, substring_starts(bits, m), key_bits)
        return cls(codes, None if first is not None else ids, m, key_bits, offsets, positions, first_id=first or 0)

    @classmethod
    def merged(cls, before: Segment, after: Segment, bits: int, tables: int | None) -> Segment:
        """One segment of both, ``before``'s items first."""
        if before.ids is None and after.ids is None and after.first_id == before.first_id + before.count:
            ids = before.first_id
        else:
            ids = np.concatenate([before.id_array(), after.id_array()])
        return cls.build(np.concatenate([before.codes, after.codes]), ids, bits, tables)

    @property
    def count(self) -> int:
        return int(self.codes.shape[0])

    @functools.cached_property
    def starts(self) -> np.ndarray:
        """The first bit of each table's substring (:func:`tfhash.mih.substring_starts`)."""
        return substring_starts(self.codes.shape[1] * 8, self.tables)

    def id_array(self) -> np.ndarray:
        if self.ids is not None:
            return self.ids
        return np.arange(self.first_id, self.first_id + self.count, dtype=np.int64)

    def ids_at(self, positions: np.ndarray) -> np.ndarray:
        """The ids of the items at ``positions`` in this segment."""
        return self.first_id + positions.astype(np.int64) if self.ids is None else self.ids[positions]

    def holds(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` this segment holds."""
        if self.ids is None:
            return (ids >= self.first_id) & (ids < self.first_id + self.count)
        return np.isin(ids, self.ids)

    def overlaps(self, first: int, count: int) -> bool:
        """Whether this segment holds an id of ``first .. first + count - 1``."""
        if self.ids is None:
            return self.first_id < first + count and first < self.first_id + self.count
        return bool(((self.ids >= first) & (self.ids < first + count)).any())

    def items_in(self, ids: np.ndarray) -> np.ndarray:
        """Which of this segment's items have one of ``ids``."""
        if self.ids is not None:
            return np.isin(self.ids, ids)
        inside = ids[self.holds(ids)] - self.first_id
        mask = np.zeros(self.count, bool)
        mask[inside] = True
        return mask

    def largest_id(self) -> int:
        return self.first_id + self.count - 1 if self.ids is None else int(self.ids.max())

    def describe(self) -> dict:
        described = {"count": self.count, "tables": self.tables, "key_bits": self.key_bits}
        return described if self.ids is not None else {**described, "first_id": self.first_id}

    def files(self) -> dict[str, np.ndarray]:
        """Its arrays by file name (no ids file for a range)."""
        named = dict(zip(SEGMENT_FILES, (self.codes, self.ids, self.offsets, self.positions), strict=True))
        return {name: array for name, array in named.items() if array is not None}


def _range_start(ids: np.ndarray) -> int | None:
    """The first id when ``ids`` are consecutive and ascending (``first, first + 1, ...``), else None."""
    if not ids.size:
        return None
    first = int(ids[0])
    for start in range(0, ids.size, _RANGE_CHUNK):
        chunk = ids[start : start + _RANGE_CHUNK]
        if not np.array_equal(chunk, np.arange(first + start, first + start + chunk.size)):
            return None
    return first


class MultiIndexHashing(HashIndex):
    """Exact Hamming k-NN and range search by multi-index hashing (Norouzi et al., CVPR 2012): the
    same answers as ``BFlat`` (distances, ids, ties in insertion order), at a cost that grows with
    the distance of the k-th neighbour rather than with the collection.

    The items live in segments, each with its own tables: an add appends a segment and merges it
    into the one before only while it holds at least :data:`MERGE_SHARE` of it, so adding 1M codes
    to 100M builds tables for the 1M alone. A search runs on every segment and merges their answers
    by (distance, insertion order). A query whose work in a segment passes :data:`SCAN_SHARE` of its
    items, or would (codes far from everything, such as uniform random ones), scans that segment
    linearly with ``BFlat``'s kernel instead: about ``BFlat``'s cost.

    Saved, each segment is a folder of ``.npy`` arrays (codes, the tables' offsets and positions,
    and ids unless they are a range); loaded with ``mapped=True`` they are mapped, so every serving process shares one
    copy in the page cache. A save of a loaded index links the files of the segments it did not
    change (same file system; copied otherwise), so publishing an add as a new version writes only
    the new segment.

    Args:
        bits: code length K (multiple of 8).
        method: ``"mih"``, the one method.
        tables: substrings (tables) of every segment; ``None`` chooses it per segment from its size,
            K / log2(n) rounded up (:func:`tfhash.mih.default_tables`).

    Capability: :data:`~tfhash.index.base.RANGE_SEARCH`.
    """

    format_family = "binary"
    methods = ("mih",)
    exact_methods = frozenset({"mih"})
    method_param = "kind"
    row_layout = PACKED
    capabilities = frozenset({RANGE_SEARCH})

    def __init__(self, bits: int, method: str = "mih", tables: int | None = None):
        super().__init__(bits, method)
        if tables is not None and (isinstance(tables, bool) or not isinstance(tables, (int, np.integer))
                                   or not 1 <= tables <= self.bits // 8):  # fmt: skip
            raise HashIndexError(f"tables must be an integer in 1..{self.bits // 8} for {self.bits}-bit codes "
                                 f"(substrings of at least 8 bits), got {tables!r}; or None to choose it from the size")  # fmt: skip
        self.tables = None if tables is None else int(tables)
        self.segments: list[Segment] = []
        #: Queries (per segment) handed to the linear scan so far: what uniform-like codes cost.
        self.scanned = 0

    def settings(self) -> dict:
        return {"tables": self.tables}

    # --- storage primitives ------------------------------------------------------------------

    @property
    def ntotal(self) -> int:
        return sum(s.count for s in self.segments)

    def ids(self) -> np.ndarray:
        """External ids in insertion order."""
        return np.concatenate([s.id_array() for s in self.segments]) if self.segments else np.zeros(0, np.int64)

    def codes(self) -> np.ndarray:
        """The packed codes in insertion order."""
        return np.concatenate([s.codes for s in self.segments]) if self.segments else np.zeros((0, self.bits // 8), np.uint8)

    def _existing(self, ids: np.ndarray) -> np.ndarray:
        found = np.zeros(ids.shape, bool)
        for segment in self.segments:
            found |= segment.holds(ids)
        return ids[found]

    def _new_ids(self, ids, count: int) -> np.ndarray | int:
        """As :meth:`HashIndex._new_ids`, but automatic ids, and given ids that are a range, as
        their first id alone: a segment keeps a range so, and an array of them (with the sort that
        checks them for repeats) would weigh more than 64-bit codes at the build's peak."""
        if ids is None:
            return max((s.largest_id() for s in self.segments if s.count), default=-1) + 1
        ids = np.asarray(ids)
        first = _range_start(ids) if ids.shape == (count,) and np.issubdtype(ids.dtype, np.integer) else None
        if first is None or first < 0:
            return super()._new_ids(ids, count)
        if any(s.overlaps(first, count) for s in self.segments):  # the full check names the ids held
            return super()._new_ids(ids, count)
        return first

    def _insert(self, rows: np.ndarray, ids: np.ndarray | int) -> None:
        self._insert_gathered(np.array(rows), ids)  # its own copy of the rows

    def _insert_gathered(self, rows: np.ndarray, ids: np.ndarray | int) -> None:
        if not rows.shape[0]:
            return
        self.segments.append(Segment.build(rows, ids, self.bits, self.tables))
        while len(self.segments) > 1 and self.segments[-1].count >= MERGE_SHARE * self.segments[-2].count:
            last, before = self.segments.pop(), self.segments.pop()
            self.segments.append(Segment.merged(before, last, self.bits, self.tables))

    def _delete(self, ids: np.ndarray) -> int:
        """Rebuild the segments that lose items (and drop those that lose all)."""
        kept, removed = [], 0
        for segment in self.segments:
            keep = ~segment.items_in(ids)
            removed += segment.count - int(keep.sum())
            if keep.all():
                kept.append(segment)
            elif keep.any():
                kept.append(Segment.build(segment.codes[keep], segment.id_array()[keep], self.bits, self.tables))
        self.segments = kept
        return removed

    # --- queries -----------------------------------------------------------------------------

    def _search(self, rows: np.ndarray, k: int) -> SearchResult:
        """``int32`` distances and ``int64`` ids, nearest first, ties in insertion order (exact)."""
        parts_d, parts_p, start = [], [], 0
        for segment in self.segments:
            kk = min(k, segment.count)
            distances, positions, finished = mih_knn(rows, segment.codes, segment.starts,
                                                     segment.key_bits, segment.offsets, segment.positions, kk,
                                                     self._work_limit(segment))  # fmt: skip
            if not finished.all():
                scanned = ~finished
                self.scanned += int(scanned.sum())
                distances[scanned], positions[scanned] = knn_search(rows[scanned], segment.codes, kk)
            parts_d.append(distances)
            parts_p.append(positions + start)
            start += segment.count
        distances, positions = np.concatenate(parts_d, axis=1), np.concatenate(parts_p, axis=1)
        if len(self.segments) > 1:
            order = np.lexsort((positions, distances), axis=1)[:, :k]
            distances, positions = np.take_along_axis(distances, order, 1), np.take_along_axis(positions, order, 1)
        return SearchResult(distances.astype(np.int32), self._ids_at(positions))

    def _range_search(self, rows: np.ndarray, radius: int) -> list[SearchResult]:
        """Every item within ``radius``, by distance, ties in insertion order (exact)."""
        return self._found_in_segments(rows, lambda s: mih_range(rows, s.codes, s.starts, s.key_bits, s.offsets, s.positions,
                                                                  radius, self._work_limit(s)),
                                       lambda some, s: range_search(some, s.codes, radius))  # fmt: skip

    def _search_with_ties(self, rows: np.ndarray, k: int) -> list[SearchResult]:
        """The k nearest and every item tied with the k-th, in one search of each segment (a
        segment's items within its own k-th distance include those within the whole index's)."""
        found = self._found_in_segments(rows, lambda s: mih_knn_ties(rows, s.codes, s.starts, s.key_bits, s.offsets, s.positions,
                                                                     min(k, s.count), self._work_limit(s)),
                                        lambda some, s: knn_ties_search(some, s.codes, min(k, s.count)))  # fmt: skip
        if len(self.segments) == 1:
            return found
        within = [r.distances <= r.distances[k - 1] for r in found]  # the whole index's k-th distance
        return [SearchResult(r.distances[keep], r.ids[keep]) for r, keep in zip(found, within, strict=True)]

    def _found_in_segments(self, rows: np.ndarray, search, scan) -> list[SearchResult]:
        """Each query's items that ``search`` (a segment -> per query an ``(distances, positions)``
        pair, and which queries finished) finds in every segment, ``scan`` (queries, segment ->
        offsets, distances, positions) answering the queries that did not finish; by distance,
        ties in insertion order."""
        found_d = [[] for _ in range(rows.shape[0])]
        found_p = [[] for _ in range(rows.shape[0])]
        start = 0
        for segment in self.segments:
            answers, finished = search(segment)
            scanned = np.flatnonzero(~finished)
            self.scanned += int(scanned.size)
            if scanned.size:
                limits, distances, positions = scan(rows[scanned], segment)
                for j, q in enumerate(scanned):
                    answers[q] = distances[limits[j] : limits[j + 1]], positions[limits[j] : limits[j + 1]]
            for q, (distances, positions) in enumerate(answers):
                found_d[q].append(distances)
                found_p[q].append(positions + start)
            start += segment.count
        results = []
        for d_parts, p_parts in zip(found_d, found_p, strict=True):
            distances, positions = np.concatenate(d_parts), np.concatenate(p_parts)
            order = np.lexsort((positions, distances))
            results.append(SearchResult(distances[order].astype(np.int32), self._ids_at(positions[order])))
        return results

    def _work_limit(self, segment: Segment) -> int:
        return max(64, int(segment.count * SCAN_SHARE))

    def _ids_at(self, positions: np.ndarray) -> np.ndarray:
        """External ids at global positions (insertion order across the segments)."""
        if len(self.segments) == 1:
            return self.segments[0].ids_at(positions)
        starts = np.cumsum([0] + [s.count for s in self.segments])
        which = np.searchsorted(starts, positions, side="right") - 1
        ids = np.empty(positions.shape, np.int64)
        for i, segment in enumerate(self.segments):
            here = which == i
            ids[here] = segment.ids_at(positions[here] - starts[i])
        return ids

    # --- files -------------------------------------------------------------------------------

    def write_files(self, directory) -> None:
        """One folder per segment, ``segment-000``, ...: its arrays, linked from the folder they were
        read from when that still holds them."""
        for i, segment in enumerate(self.segments):
            folder = os.path.join(directory, f"segment-{i:03d}")
            os.makedirs(folder)
            for name, array in segment.files().items():
                target = os.path.join(folder, name)
                if segment.source is not None and _linked(os.path.join(segment.source, name), target):
                    continue
                np.save(target, array, allow_pickle=False)

    @classmethod
    def read_files(cls, directory, manifest: dict, mapped: bool = False) -> MultiIndexHashing:
        params = dict(manifest["params"])
        layout = params.pop("segments", None)
        index = cls.from_params(manifest["bits"], params)
        if not isinstance(layout, list):
            raise IndexFormatError(f"{directory}: the manifest's params name no segments; rebuild the index")
        mode = "c" if mapped else None  # copy-on-write: see InProcessIndex.read_files
        for i, described in enumerate(layout):
            folder = os.path.join(directory, f"segment-{i:03d}")
            ranged = "first_id" in described
            arrays = {name: np.load(os.path.join(folder, name), mmap_mode=mode, allow_pickle=False)
                      for name in SEGMENT_FILES if not (ranged and name == IDS_FILE)}  # fmt: skip
            positions, source = arrays["positions.npy"], folder
            if positions.dtype == np.uint32 and positions.ndim == 2 and positions.shape[1] == arrays["codes.npy"].shape[0]:
                positions, source = pack_positions(positions), None  # saved before positions were packed: written anew on save
            segment = Segment(arrays["codes.npy"], arrays.get(IDS_FILE), int(described["tables"]), int(described["key_bits"]),
                              arrays["offsets.npy"], positions, source=source,
                              first_id=int(described.get("first_id", 0)))  # fmt: skip
            _check_segment(segment, index.bits, folder)
            index.segments.append(segment)
        if index.ntotal != manifest["count"]:
            raise IndexFormatError(f"{directory}: the segments hold {index.ntotal} items, the manifest records {manifest['count']}")
        return index

    def params(self) -> dict:
        """:meth:`HashIndex.params` and the segments' layout (count, tables, key bits of each)."""
        return {**super().params(), "segments": [s.describe() for s in self.segments]}


def _linked(source: str, target: str) -> bool:
    """Hard-link ``source`` at ``target`` (copy it across file systems); False when it is gone."""
    if not os.path.isfile(source):
        return False
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
    return True


def _check_segment(segment: Segment, bits: int, folder: str) -> None:
    """Refuse arrays whose dtypes or shapes do not fit one another (a file swapped in by hand)."""
    n, m = segment.count, segment.tables
    expected = {"codes.npy": (np.uint8, (n, bits // 8)), IDS_FILE: (np.int64, (n,)),
                "offsets.npy": (np.uint32, (m, (1 << segment.key_bits) + 1)),
                "positions.npy": (np.uint64, (m, packed_words(n)))}  # fmt: skip
    for name, array in segment.files().items():
        dtype, shape = expected[name]
        if array.dtype != dtype or array.shape != shape:
            raise IndexFormatError(f"{folder}: {name} holds {array.dtype} {array.shape}; a segment of {n} {bits}-bit codes "
                                   f"with {m} tables of {segment.key_bits} key bits stores {np.dtype(dtype)} {shape}")  # fmt: skip
    if n and int(segment.offsets[:, -1].max()) != n:
        raise IndexFormatError(f"{folder}: the tables' offsets end at {int(segment.offsets[:, -1].max())}, not at the {n} items")
    if segment.ids is None and segment.first_id < 0:
        raise IndexFormatError(f"{folder}: the manifest gives the segment's ids as a range from {segment.first_id}; ids are >= 0")
