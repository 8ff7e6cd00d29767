"""Compiled Hamming kernels over packed codes: the popcount, exact k-NN and range search.

The distance of two codes is the popcount of the XOR of their packed words (:func:`code_words`,
:func:`popcount`), numba-compiled for the host CPU so that one source vectorises to what the CPU
has. :func:`knn_search` keeps no heap and returns ties in insertion order, as FAISS's
``IndexBinaryFlat`` does; :func:`range_search` returns every code within a radius. Both spread a
batch over numba's threads (docs/design.md s.10).
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["popcount", "code_words", "set_threads", "search_threads", "knn_search", "knn_ties_search", "range_search"]

#: Items one vectorised loop checks against the threshold before any of them is examined; a block
#: with some is checked again in sub-blocks of :data:`SUB_BLOCK`, and only those are examined item
#: by item (large blocks keep the common loop long, small sub-blocks keep the examined part small).
BLOCK = 1024
SUB_BLOCK = 128
#: Database items scanned by a query group before it moves to the next tile (64 Ki items: 512 KiB
#: of 64-bit codes, which stays in a core's L2 while the group's queries scan it).
TILE = 1 << 16


@intrinsic
def popcount(typingctx, value):  # pragma: no cover - compiled
    """Number of set bits of an unsigned integer (LLVM ctpop: one instruction on x86-64), as a
    signed ``int64``: sums of popcounts stay integers (numba types ``uint64 + int64`` as float).

    Compiled for the host CPU (numba's default), a block of distances vectorises to AVX-512
    ``VPOPCNTQ`` where the CPU has it, and to scalar ``POPCNT`` or a bit-twiddling sequence
    elsewhere, from the same source."""
    if not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        bits = builder.ctpop(args[0])
        if value.bitwidth < 64:
            bits = builder.zext(bits, ir.IntType(64))
        return bits

    return types.int64(value), codegen


def code_words(packed: np.ndarray) -> np.ndarray:
    """Packed ``uint8`` rows ``(n, K/8)`` viewed, without a copy where the rows are contiguous, as
    the widest unsigned words that divide a row: ``uint64`` for K a multiple of 64, else ``uint32``,
    ``uint16`` or the bytes themselves."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    width = packed.shape[1]
    for itemsize, dtype in ((8, np.uint64), (4, np.uint32), (2, np.uint16)):
        if width % itemsize == 0:
            return packed.view(dtype)
    return packed


# The loops below index with unsigned integers: a signed index makes numba check for negative
# (wrap-around) indices on every access, which stops LLVM from vectorising them.
_ONE, _TWO, _THREE, _FOUR = np.uint64(1), np.uint64(2), np.uint64(3), np.uint64(4)
_SIXTEEN, _THIRTY_TWO = np.uint64(16), np.uint64(32)


@numba.njit(cache=True, nogil=True, inline="always")
def _joined48(words16, at):  # pragma: no cover - compiled
    """The three 16-bit words at ``at`` as one 64-bit word: a 48-bit code's popcount is then one
    64-bit popcount, which vectorises where three 16-bit ones do not (2.5x faster per scan)."""
    return np.uint64(words16[at]) | (np.uint64(words16[at + _ONE]) << _SIXTEEN) | (np.uint64(words16[at + _TWO]) << _THIRTY_TWO)


@numba.njit(cache=True, nogil=True)
def _count_within(query, db_flat, words, start, stop, threshold):  # pragma: no cover - compiled
    """How many of rows ``start..stop`` lie within Hamming distance ``threshold`` of ``query``;
    ``db_flat``: the database words, row after row. One loop per common width, so that the
    compiler sees a constant stride and vectorises the popcounts (nothing is stored: this is the
    loop every row goes through)."""
    rows = db_flat[start * words : stop * words]
    count = np.uint64(stop - start)
    within = 0
    if words == 1:
        q0 = query[0]
        for j in range(count):
            within += popcount(q0 ^ rows[j]) <= threshold
    elif words == 2:
        q0, q1 = query[0], query[1]
        for j in range(count):
            within += popcount(q0 ^ rows[_TWO * j]) + popcount(q1 ^ rows[_TWO * j + _ONE]) <= threshold
    elif words == 3 and rows.itemsize == 2:  # 48 bits: three 16-bit words joined into one 64-bit one
        q = _joined48(query, np.uint64(0))
        for j in range(count):
            within += popcount(q ^ _joined48(rows, _THREE * j)) <= threshold
    elif words == 3:  # 96 bits (3 x uint32), 192 (3 x uint64)
        q0, q1, q2 = query[0], query[1], query[2]
        for j in range(count):
            at = _THREE * j
            within += popcount(q0 ^ rows[at]) + popcount(q1 ^ rows[at + _ONE]) + popcount(q2 ^ rows[at + _TWO]) <= threshold
    elif words == 4:
        q0, q1, q2, q3 = query[0], query[1], query[2], query[3]
        for j in range(count):
            at = _FOUR * j
            d = popcount(q0 ^ rows[at]) + popcount(q1 ^ rows[at + _ONE]) + popcount(q2 ^ rows[at + _TWO])
            within += d + popcount(q3 ^ rows[at + _THREE]) <= threshold
    else:
        for j in range(count):
            within += _distance(query, rows, words, j) <= threshold
    return within


@numba.njit(cache=True, nogil=True)
def _block_distances(query, db_flat, words, start, stop, out):  # pragma: no cover - compiled
    """``out[j - start]`` = Hamming distance of ``query`` to row j, for j in ``start..stop``
    (vectorised as :func:`_count_within`; for the blocks that have items within the threshold)."""
    rows = db_flat[start * words : stop * words]
    count = np.uint64(stop - start)
    if words == 1:
        q0 = query[0]
        for j in range(count):
            out[j] = popcount(q0 ^ rows[j])
    elif words == 2:
        q0, q1 = query[0], query[1]
        for j in range(count):
            out[j] = popcount(q0 ^ rows[_TWO * j]) + popcount(q1 ^ rows[_TWO * j + _ONE])
    elif words == 3 and rows.itemsize == 2:
        q = _joined48(query, np.uint64(0))
        for j in range(count):
            out[j] = popcount(q ^ _joined48(rows, _THREE * j))
    elif words == 3:
        q0, q1, q2 = query[0], query[1], query[2]
        for j in range(count):
            at = _THREE * j
            out[j] = popcount(q0 ^ rows[at]) + popcount(q1 ^ rows[at + _ONE]) + popcount(q2 ^ rows[at + _TWO])
    else:
        for j in range(count):
            out[j] = _distance(query, rows, words, j)


@numba.njit(cache=True, nogil=True)
def _distance(query, rows, words, j):  # pragma: no cover - compiled
    """Hamming distance of ``query`` to row j of ``rows`` (words row after row)."""
    h = 0
    at = np.uint64(words) * np.uint64(j)
    for w in range(np.uint64(words)):
        h += popcount(query[w] ^ rows[at + w])
    return h


@numba.njit(cache=True, nogil=True)
def _compact(k, cand_d, cand_p, hist, state):  # pragma: no cover - compiled
    """Drop the candidates no longer needed (beyond the threshold, or at it beyond the k-th), in
    order. ``state``: size, threshold, candidates below the threshold."""
    size, threshold, below = state[0], state[1], state[2]
    room_at = k - below
    kept = 0
    taken_at = 0
    for r in range(size):
        d = cand_d[r]
        if d < threshold or (d == threshold and taken_at < room_at):
            if d == threshold:
                taken_at += 1
            cand_d[kept] = d
            cand_p[kept] = cand_p[r]
            kept += 1
    hist[threshold] = taken_at
    state[0] = kept


@numba.njit(cache=True, nogil=True)
def _scan(query, db_flat, words, start, stop, k, cand_d, cand_p, hist, state, distances):  # pragma: no cover - compiled
    """Scan rows ``start..stop`` for ``query``'s k nearest, updating its candidates in place."""
    capacity = cand_d.shape[0]
    for block in range(start, stop, BLOCK):
        end = min(block + BLOCK, stop)
        if _count_within(query, db_flat, words, block, end, state[1]) == 0:
            continue  # the common case once the threshold has settled
        for sub in range(block, end, SUB_BLOCK):
            sub_end = min(sub + SUB_BLOCK, end)
            if _count_within(query, db_flat, words, sub, sub_end, state[1]) == 0:
                continue
            _block_distances(query, db_flat, words, sub, sub_end, distances)
            threshold = state[1]  # a local: the loop below reads it for every item
            for j in range(sub_end - sub):
                d = distances[j]
                if d > threshold or (d == threshold and state[2] + hist[threshold] >= k):
                    continue
                if state[0] == capacity:
                    _compact(k, cand_d, cand_p, hist, state)
                cand_d[state[0]] = d
                cand_p[state[0]] = sub + j
                state[0] += 1
                hist[d] += 1
                if d < threshold:
                    state[2] += 1
                    while state[2] >= k:  # the k nearest are all below: the threshold falls
                        state[1] -= 1
                        state[2] -= hist[state[1]]
                    threshold = state[1]


@numba.njit(cache=True, nogil=True)
def _select(k, bits, cand_d, cand_p, size, hist, out_d, out_p):  # pragma: no cover - compiled
    """The k nearest of candidates listed in insertion order (a superset of the k nearest), sorted
    by distance, ties in insertion order (a stable counting sort)."""
    for h in range(bits + 1):
        hist[h] = 0
    for r in range(size):
        hist[cand_d[r]] += 1
    threshold, below = 0, 0
    while below + hist[threshold] < k:
        below += hist[threshold]
        threshold += 1
    # slot[h]: where the next output at distance h goes
    taken = 0
    for h in range(threshold + 1):
        count = hist[h]
        hist[h] = taken
        taken += count
    room_at = k - below
    for r in range(size):
        d = cand_d[r]
        if d > threshold:
            continue
        if d == threshold:
            if room_at == 0:
                continue
            room_at -= 1
        out_d[hist[d]] = d
        out_p[hist[d]] = cand_p[r]
        hist[d] += 1


@numba.njit(cache=True, nogil=True)
def _ties_part(query, db_flat, words, start, stop, k, bits):  # pragma: no cover - compiled
    """Rows ``start..stop``'s candidates for the items within ``query``'s k-th smallest distance
    among them, every tie at it included: ``(distances, positions)`` in row order, a superset (the
    threshold falls as rows are read: the merge keeps those within the final one). As
    :func:`_scan`, but an item at the threshold is always kept, so the buffer grows with the ties."""
    hist = np.zeros(bits + 1, np.int64)
    threshold, below, size = bits, 0, 0  # below: kept items nearer than the threshold
    cand_d = np.empty(2 * k + 64, np.int32)
    cand_p = np.empty(2 * k + 64, np.int64)
    distances = np.empty(SUB_BLOCK, np.int32)
    for block in range(start, stop, BLOCK):
        end = min(block + BLOCK, stop)
        if _count_within(query, db_flat, words, block, end, threshold) == 0:
            continue
        for sub in range(block, end, SUB_BLOCK):
            sub_end = min(sub + SUB_BLOCK, end)
            if _count_within(query, db_flat, words, sub, sub_end, threshold) == 0:
                continue
            _block_distances(query, db_flat, words, sub, sub_end, distances)
            for j in range(sub_end - sub):
                d = distances[j]
                if d > threshold:
                    continue
                if size == cand_d.shape[0]:  # drop what the threshold has passed; grow when ties fill it
                    kept = 0
                    for r in range(size):
                        if cand_d[r] <= threshold:
                            cand_d[kept] = cand_d[r]
                            cand_p[kept] = cand_p[r]
                            kept += 1
                    size = kept
                    if size > cand_d.shape[0] // 2:
                        grown_d = np.empty(2 * cand_d.shape[0], np.int32)
                        grown_p = np.empty(2 * cand_d.shape[0], np.int64)
                        grown_d[:size] = cand_d[:size]
                        grown_p[:size] = cand_p[:size]
                        cand_d, cand_p = grown_d, grown_p
                cand_d[size] = d
                cand_p[size] = sub + j
                size += 1
                hist[d] += 1
                if d < threshold:
                    below += 1
                    while below >= k:  # k items nearer than the threshold: it falls
                        threshold -= 1
                        below -= hist[threshold]
    return cand_d[:size], cand_p[:size]


@numba.njit(cache=True, nogil=True)
def _knn_task(query_words, db_flat, n, k, bits, group, groups, part, parts, cand_d, cand_p, sizes):  # pragma: no cover - compiled
    """One task: the queries ``group, group + groups, ...`` over database part ``part`` of
    ``parts``, tile by tile; their candidates go to ``cand_*[i, part]``, their count to ``sizes``."""
    m = query_words.shape[0]
    words = query_words.shape[1]
    part_size = -(-n // parts)
    start, stop = part * part_size, min(n, (part + 1) * part_size)
    hist = np.zeros((m, bits + 1), np.int64)
    state = np.empty((m, 3), np.int64)
    distances = np.empty(SUB_BLOCK, np.int32)
    for i in range(group, m, groups):
        state[i, 0], state[i, 1], state[i, 2] = 0, bits, 0
    for tile in range(start, stop, TILE):
        tile_end = min(tile + TILE, stop)
        for i in range(group, m, groups):
            _scan(query_words[i], db_flat, words, tile, tile_end, k, cand_d[i, part], cand_p[i, part], hist[i], state[i],
                  distances)  # fmt: skip
    for i in range(group, m, groups):
        sizes[i, part] = state[i, 0]


@numba.njit(cache=True, nogil=True)
def _merge(i, k, bits, cand_d, cand_p, sizes, out_d, out_p):  # pragma: no cover - compiled
    """Query i's k nearest from its parts' candidates, taken in part order (= insertion order)."""
    parts = sizes.shape[1]
    total = 0
    for part in range(parts):
        total += sizes[i, part]
    merged_d = np.empty(total, np.int32)
    merged_p = np.empty(total, np.int64)
    at = 0
    for part in range(parts):
        for r in range(sizes[i, part]):
            merged_d[at] = cand_d[i, part, r]
            merged_p[at] = cand_p[i, part, r]
            at += 1
    _select(k, bits, merged_d, merged_p, total, np.empty(bits + 1, np.int64), out_d[i], out_p[i])


@numba.njit(cache=True, nogil=True)
def _knn_serial(query_words, db_flat, n, k, bits, cand_d, cand_p, sizes, out_d, out_p):  # pragma: no cover - compiled
    """All queries on the calling thread (the GIL released: concurrent callers run in parallel)."""
    _knn_task(query_words, db_flat, n, k, bits, 0, 1, 0, 1, cand_d, cand_p, sizes)
    for i in range(query_words.shape[0]):
        _merge(i, k, bits, cand_d, cand_p, sizes, out_d, out_p)


@numba.njit(cache=True, nogil=True, parallel=True)
def _knn_parallel(query_words, db_flat, n, k, bits, groups, parts, cand_d, cand_p, sizes, out_d, out_p):  # pragma: no cover - compiled
    for task in numba.prange(groups * parts):
        _knn_task(query_words, db_flat, n, k, bits, task // parts, groups, task % parts, parts, cand_d, cand_p, sizes)
    for i in numba.prange(query_words.shape[0]):
        _merge(i, k, bits, cand_d, cand_p, sizes, out_d, out_p)


@numba.njit(cache=True, nogil=True)
def _range_count(query, db_flat, n, radius):  # pragma: no cover - compiled
    return _count_within(query, db_flat, query.shape[0], 0, n, radius)


@numba.njit(cache=True, nogil=True)
def _range_fill(query, db_flat, n, radius, found_d, found_p):  # pragma: no cover - compiled
    """Query's hits (as many as :func:`_range_count` found) into ``found_*``, by distance, ties in order."""
    words = query.shape[0]
    distances = np.empty(SUB_BLOCK, np.int32)
    slot = np.zeros(radius + 2, np.int64)
    scratch_d = np.empty(found_d.shape[0], np.int32)
    scratch_p = np.empty(found_d.shape[0], np.int64)
    at = 0
    for block in range(0, n, BLOCK):
        end = min(block + BLOCK, n)
        if _count_within(query, db_flat, words, block, end, radius) == 0:
            continue
        for sub in range(block, end, SUB_BLOCK):
            sub_end = min(sub + SUB_BLOCK, end)
            _block_distances(query, db_flat, words, sub, sub_end, distances)
            for j in range(sub_end - sub):
                d = distances[j]
                if d <= radius:
                    scratch_d[at] = d
                    scratch_p[at] = sub + j
                    slot[d + 1] += 1
                    at += 1
    for h in range(1, radius + 2):
        slot[h] += slot[h - 1]
    for r in range(at):
        d = scratch_d[r]
        found_d[slot[d]] = d
        found_p[slot[d]] = scratch_p[r]
        slot[d] += 1


@numba.njit(cache=True, nogil=True)
def _range_serial(query_words, db_flat, n, radius, offsets, out_d, out_p, fill):  # pragma: no cover - compiled
    for i in range(query_words.shape[0]):
        if fill:
            _range_fill(query_words[i], db_flat, n, radius, out_d[offsets[i] : offsets[i + 1]], out_p[offsets[i] : offsets[i + 1]])
        else:
            offsets[i + 1] = _range_count(query_words[i], db_flat, n, radius)


@numba.njit(cache=True, nogil=True, parallel=True)
def _range_parallel(query_words, db_flat, n, radius, offsets, out_d, out_p, fill):  # pragma: no cover - compiled
    for i in numba.prange(query_words.shape[0]):
        if fill:
            _range_fill(query_words[i], db_flat, n, radius, out_d[offsets[i] : offsets[i + 1]], out_p[offsets[i] : offsets[i + 1]])
        else:
            offsets[i + 1] = _range_count(query_words[i], db_flat, n, radius)


_settings = {"threads": 0}


def set_threads(threads: int) -> None:
    """Threads of every later :func:`knn_search` that names none (0: all of numba's threads; 1:
    the calling thread alone, with the GIL released, which is what a server whose worker threads
    search concurrently wants: its concurrency comes from the workers)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"threads must be an int >= 0 (0: all), got {threads!r}")
    _settings["threads"] = threads


def search_threads(threads: int | None = None) -> int:
    """The threads a search runs on: ``threads`` when given, else :func:`set_threads`'s setting,
    else all of numba's."""
    return int(threads or _settings["threads"] or numba.get_num_threads())


def _tasks(num_queries: int, threads: int) -> tuple[int, int]:
    """(query groups, database parts): groups of queries when there are enough queries to keep
    every thread busy, else the database split into parts.

    A thread scans the database tile by tile for its group's queries, so a tile is read from cache
    for all of them; a single query is split over the threads, and the parts' candidates are merged
    in part order, which keeps insertion order."""
    if num_queries >= threads:
        return threads, 1
    return max(1, num_queries), max(1, threads // max(1, num_queries))


def _words(query_packed: np.ndarray, db_packed: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    for name, packed in (("queries", query_packed), ("database", db_packed)):
        if not isinstance(packed, np.ndarray) or packed.dtype != np.uint8 or packed.ndim != 2:
            raise ValueError(f"{name} must be packed codes, a 2-D uint8 array (n, K/8), got "
                             f"{getattr(packed, 'dtype', type(packed).__name__)} of shape {np.shape(packed)}; "
                             "pack +-1 codes with tfhash.codes.pack_codes")  # fmt: skip
    if query_packed.shape[1] * 8 != bits or db_packed.shape[1] * 8 != bits:
        raise ValueError(f"queries ({query_packed.shape[1] * 8} bits) and database ({db_packed.shape[1] * 8} bits) "
                         f"must both hold {bits}-bit codes")  # fmt: skip
    if not query_packed.flags.writeable:  # numba compiles every kernel anew for read-only arrays (seconds, on
        query_packed = query_packed.copy()  # first use): queries decoded from a request's bytes are copied
    return code_words(query_packed), code_words(db_packed)


def _check_k(k, n: int) -> None:
    """Refuse a ``k`` that is not an integer in 1..``n`` (the database rows)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ValueError(f"k must be an integer in 1..{n} (the database rows), got {k!r}")


def knn_search(query_packed: np.ndarray, db_packed: np.ndarray, k: int, threads: int | None = None):
    """Exact Hamming k-NN of packed ``uint8`` codes.

    No heap: a query scans the database in insertion order, in blocks of :data:`BLOCK` items. One
    vectorised loop counts the block's items within the current threshold, and only a block that
    has some is looked at again, item by item. The threshold is the k-th smallest distance seen so
    far; since there are only K + 1 distances, a histogram of the kept candidates gives it, and it
    only falls. An item at exactly the threshold is kept only while fewer than k candidates are at
    or below it, so among equal distances the earlier item wins: ties come back in insertion order,
    as from FAISS's ``IndexBinaryFlat`` with ``use_heap = False``. The candidate buffer of a query
    holds at most ``2k + 64`` items (compacted when full) and the last step is a counting sort by
    distance, stable in insertion order.

    Args:
        query_packed: ``(m, K/8)`` packed queries.  db_packed: ``(n, K/8)`` packed database.
        k: neighbours per query, ``1 <= k <= n``.
        threads: threads to use (default: :func:`set_threads`'s setting, else all of numba's);
            1 runs on the calling thread with the GIL released.

    Returns:
        ``(distances, positions)``: ``int32`` and ``int64`` ``(m, k)``, nearest first, ties in
        database order (the row position).
    """
    bits = np.shape(db_packed)[-1] * 8
    query_words, db_words = _words(query_packed, db_packed, bits)
    _check_k(k, db_words.shape[0])
    m = query_words.shape[0]
    distances = np.empty((m, k), np.int32)
    positions = np.empty((m, k), np.int64)
    if m == 0:
        return distances, positions
    threads = search_threads(threads)
    groups, parts = _tasks(m, threads)
    capacity = 2 * int(k) + 64  # compaction leaves at most k: one per k + 64 accepted items
    cand_d = np.empty((m, parts, capacity), np.int32)
    cand_p = np.empty((m, parts, capacity), np.int64)
    sizes = np.zeros((m, parts), np.int64)
    n, db_flat = db_words.shape[0], db_words.reshape(-1)
    if threads == 1:
        _knn_serial(query_words, db_flat, n, int(k), bits, cand_d, cand_p, sizes, distances, positions)
    else:
        _knn_parallel(query_words, db_flat, n, int(k), bits, groups, parts, cand_d, cand_p, sizes, distances, positions)
    return distances, positions


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    """The threads :func:`knn_ties_search` reads its parts on, kept: starting threads for every
    query would cost more than the scan."""
    return ThreadPoolExecutor(threads, thread_name_prefix="tfhash-hamming")


os.register_at_fork(after_in_child=_pool.cache_clear)  # a forked child has none of its parent's threads


def knn_ties_search(query_packed: np.ndarray, db_packed: np.ndarray, k: int, threads: int | None = None):
    """Every database row within each query's k-th smallest Hamming distance, the ties at it
    included, in one pass over the codes: what :func:`knn_search` returns and every row tied with
    its k-th (the candidates of :func:`tfhash.index.refine.refined_search`). As in
    :func:`knn_search`, a threshold from a histogram skips the rows beyond it; the database is read
    in ``threads`` parts on as many threads (the kernel releases the GIL), whose candidates are
    merged in part order. ``threads`` as in :func:`knn_search`.

    Returns:
        ``(offsets, distances, positions)`` as :func:`range_search`: query i's rows are
        ``offsets[i]:offsets[i + 1]``, nearest first, ties in database order.
    """
    bits = np.shape(db_packed)[-1] * 8
    query_words, db_words = _words(query_packed, db_packed, bits)
    n = db_words.shape[0]
    _check_k(k, n)
    if query_words.shape[0] == 0:
        return np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64)
    threads = search_threads(threads)
    parts = max(1, min(threads, n // BLOCK))
    bounds = [(n * p // parts, n * (p + 1) // parts) for p in range(parts)]
    db_flat, words = db_words.reshape(-1), db_words.shape[1]

    def part(task):
        i, (start, stop) = task
        return _ties_part(query_words[i], db_flat, words, start, stop, int(k), bits)

    tasks = [(i, bound) for i in range(query_words.shape[0]) for bound in bounds]
    found = [part(task) for task in tasks] if len(tasks) == 1 or threads == 1 else list(_pool(threads).map(part, tasks))
    offsets, all_d, all_p = [0], [], []
    for i in range(query_words.shape[0]):
        d = np.concatenate([found[i * parts + p][0] for p in range(parts)])
        p_ = np.concatenate([found[i * parts + p][1] for p in range(parts)])
        kth = np.partition(d, k - 1)[k - 1]
        keep = np.flatnonzero(d <= kth)
        order = keep[np.argsort(d[keep], kind="stable")]
        all_d.append(d[order])
        all_p.append(p_[order])
        offsets.append(offsets[-1] + order.size)
    return np.array(offsets, np.int64), np.concatenate(all_d).astype(np.int32), np.concatenate(all_p).astype(np.int64)


def range_search(query_packed: np.ndarray, db_packed: np.ndarray, radius: int, threads: int | None = None):
    """Every database row within Hamming distance ``radius`` (inclusive) of each query; ``threads``
    as in :func:`knn_search` (queries are spread over them).

    Returns:
        ``(offsets, distances, positions)``: query i's hits are ``offsets[i]:offsets[i + 1]`` of the
        ``int32`` distances and ``int64`` row positions, sorted by distance, ties in database order.
    """
    bits = np.shape(db_packed)[-1] * 8
    query_words, db_words = _words(query_packed, db_packed, bits)
    if isinstance(radius, bool) or not isinstance(radius, (int, np.integer)) or radius < 0:
        raise ValueError(f"radius must be an integer >= 0, got {radius!r}")
    radius = min(int(radius), bits)
    run = _range_serial if search_threads(threads) == 1 else _range_parallel
    n, db_flat = db_words.shape[0], db_words.reshape(-1)
    offsets = np.zeros(query_words.shape[0] + 1, np.int64)
    none_d, none_p = np.empty(0, np.int32), np.empty(0, np.int64)
    run(query_words, db_flat, n, radius, offsets, none_d, none_p, False)  # counts into offsets[1:]
    np.cumsum(offsets, out=offsets)
    distances = np.empty(int(offsets[-1]), np.int32)
    positions = np.empty(int(offsets[-1]), np.int64)
    run(query_words, db_flat, n, radius, offsets, distances, positions, True)
    return offsets, distances, positions
