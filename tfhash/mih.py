"""Exact Hamming search in sublinear time: multi-index hashing (Norouzi, Punjani and Fleet, "Fast
Exact Search in Hamming Space with Multi-Index Hashing", CVPR 2012 / TPAMI 2014).

A K-bit code is cut into ``m`` substrings (:func:`substring_starts`), each with a table of the items
by the first ``key_bits`` bits of that substring (:func:`build_tables`, positions bit-packed). Two
codes within distance ``r`` share a substring within ``r // m`` (the pigeonhole argument, Sec. 3),
so a query (:func:`mih_knn`, :func:`mih_range`) reads the buckets nearest its own keys first and
stops once the buckets read guarantee its answer. Answers are a linear scan's (:func:`tfhash.hamming.knn_search`):
the same distances, ties in insertion order; the cost grows with the k-th neighbour's distance.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from tfhash.hamming import _check_k, _distance, code_words, popcount, search_threads

__all__ = ["MAX_KEY_BITS", "default_tables", "default_key_bits", "substring_starts", "position_bits", "packed_words",
           "build_tables", "pack_positions", "unpack_positions", "mih_knn", "mih_knn_ties", "mih_range"]

#: The widest key a table is addressed by: 2**24 buckets, 64 MiB of uint32 offsets a table.
MAX_KEY_BITS = 24
#: Key bits below log2(items) (about four items a bucket, when the keys spread evenly).
_KEY_BITS_BELOW_LOG2 = 2


def default_tables(bits: int, count: int) -> int:
    """The paper's choice of ``m`` (Sec. 4.1: ``m = K / log2 n``, substrings of about log2(n) bits),
    rounded up: at 100M x 64 bits 3 tables, not 2, put a query's far tail (k-th neighbour at 9-10
    of 64 bits) at 3 ms rather than 13-60 ms for 0.42x the codes more memory. At least 1, at most
    K / 8 (substrings of at least 8 bits)."""
    return int(min(max(1, math.ceil(bits / math.log2(max(count, 2)))), bits // 8))


def substring_starts(bits: int, tables: int) -> np.ndarray:
    """The first bit of each of ``tables`` substrings that cut ``bits`` bits as evenly as possible
    (the longer ones first)."""
    if not 1 <= tables <= bits:
        raise ValueError(f"tables must be in 1..{bits} for {bits}-bit codes, got {tables}")
    base, extra = divmod(bits, tables)
    lengths = [base + (t < extra) for t in range(tables)]
    return np.cumsum([0] + lengths[:-1]).astype(np.int64)


def default_key_bits(bits: int, tables: int, count: int) -> int:
    """Key bits of each table: the shortest substring, at most :data:`MAX_KEY_BITS` and about
    log2(count) - 2 (a few items a bucket), at least 1."""
    shortest = bits // tables
    wanted = max(1, math.ceil(math.log2(max(count, 2))) - _KEY_BITS_BELOW_LOG2)
    return int(min(shortest, MAX_KEY_BITS, wanted))


@numba.njit(cache=True, nogil=True)
def position_bits(count):  # pragma: no cover - compiled
    """Bits a table stores a row's position in: ceil(log2(count)), at least 1 (27 at 100M rows, where
    uint32 positions would hold 2.53x the 64-bit codes with three tables, packed ones 2.30x)."""
    width = 1
    while (1 << width) < count:
        width += 1
    return width


def packed_words(count: int) -> int:
    """uint64 words of one table's packed positions of ``count`` rows, and one more: a read of any
    position may load the word after its own."""
    return (count * position_bits(count) + 63) // 64 + 1


@numba.njit(cache=True, nogil=True)
def _position(positions, t, s, width):  # pragma: no cover - compiled
    """The ``s``-th position of table ``t``, ``width`` bits wide, in the packed ``positions``
    (little-endian within and across uint64 words; the word after may be read, never used past the value)."""
    bit = np.uint64(s) * np.uint64(width)
    w = bit >> np.uint64(6)
    shift = bit & np.uint64(63)
    value = (positions[t, w] >> shift) | ((positions[t, w + np.uint64(1)] << np.uint64(1)) << (np.uint64(63) - shift))
    return value & ((np.uint64(1) << np.uint64(width)) - np.uint64(1))


@numba.njit(cache=True, nogil=True)
def _put(positions, t, s, width, value):  # pragma: no cover - compiled
    """Store ``value`` as the ``s``-th position of table ``t`` (its bits zero before)."""
    bit = np.uint64(s) * np.uint64(width)
    w = bit >> np.uint64(6)
    shift = bit & np.uint64(63)
    v = np.uint64(value)
    positions[t, w] |= v << shift
    if shift + np.uint64(width) > np.uint64(64):
        positions[t, w + np.uint64(1)] |= v >> (np.uint64(64) - shift)


@numba.njit(cache=True, nogil=True)
def _pack(rows, width, positions):  # pragma: no cover - compiled
    for t in range(rows.shape[0]):
        for s in range(rows.shape[1]):
            _put(positions, t, s, width, rows[t, s])


@numba.njit(cache=True, nogil=True)
def _unpack(positions, width, rows):  # pragma: no cover - compiled
    for t in range(rows.shape[0]):
        for s in range(rows.shape[1]):
            rows[t, s] = _position(positions, t, s, width)


def pack_positions(rows: np.ndarray) -> np.ndarray:
    """Tables' row positions ``(m, n)`` (any unsigned integers below n) packed as :func:`build_tables`
    stores them: :func:`position_bits` (n) bits each, ``(m, words)`` ``uint64``."""
    rows = np.ascontiguousarray(rows)
    if rows.size and not 0 <= int(rows.min()) <= int(rows.max()) < rows.shape[1]:
        raise ValueError(f"positions of {rows.shape[1]} rows lie in 0..{rows.shape[1] - 1}, got {int(rows.min())}..{int(rows.max())}")
    positions = np.zeros((rows.shape[0], packed_words(rows.shape[1])), np.uint64)
    _pack(rows, position_bits(rows.shape[1]), positions)
    return positions


def unpack_positions(positions: np.ndarray, count: int) -> np.ndarray:
    """The ``(m, count)`` ``uint32`` row positions of packed tables (the inverse of :func:`pack_positions`)."""
    rows = np.empty((positions.shape[0], count), np.uint32)
    _unpack(positions, position_bits(count), rows)
    return rows


@numba.njit(cache=True, nogil=True, inline="always")
def _key(row_bytes, base, width, start, key_bits):  # pragma: no cover - compiled
    """Bits ``start .. start + key_bits`` of the packed row at ``row_bytes[base:base + width]``
    (big-endian bit order, :mod:`tfhash.codes`), as an integer."""
    first = start >> 3
    value = np.uint64(0)
    for b in range(5):  # key_bits <= 32, plus at most 7 bits before it: 5 bytes
        value = value << np.uint64(8)
        if first + b < width:
            value |= np.uint64(row_bytes[base + first + b])
    shift = np.uint64(40 - (start & 7) - key_bits)
    return (value >> shift) & ((np.uint64(1) << np.uint64(key_bits)) - np.uint64(1))


@numba.njit(cache=True, nogil=True)
def _row_distance(q_words, db_words, words, x):  # pragma: no cover - compiled
    """Hamming distance of the query to row ``x``, unrolled for rows of one to three words: the
    general loop keeps the CPU from overlapping the random reads of successive rows (2.5x slower
    a query at 100M codes)."""
    if words == 1:
        return popcount(q_words[0] ^ db_words[x])
    at = np.uint64(words) * x
    if words == 2:
        return popcount(q_words[0] ^ db_words[at]) + popcount(q_words[1] ^ db_words[at + np.uint64(1)])
    if words == 3:
        return (popcount(q_words[0] ^ db_words[at]) + popcount(q_words[1] ^ db_words[at + np.uint64(1)])
                + popcount(q_words[2] ^ db_words[at + np.uint64(2)]))  # fmt: skip
    return _distance(q_words, db_words, words, x)


@numba.njit(cache=True, nogil=True)
def _build(db_bytes, width, n, starts, key_bits, offsets, positions, pos_bits):  # pragma: no cover - compiled
    for t in range(starts.shape[0]):
        for i in range(n):
            offsets[t, _key(db_bytes, i * width, width, starts[t], key_bits) + np.uint64(1)] += 1
        for b in range(1, offsets.shape[1]):
            offsets[t, b] += offsets[t, b - 1]
        cursor = offsets[t, :-1].copy()
        for i in range(n):
            key = _key(db_bytes, i * width, width, starts[t], key_bits)
            _put(positions, t, cursor[key], pos_bits, i)
            cursor[key] += 1


def build_tables(packed: np.ndarray, starts: np.ndarray, key_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The tables of the packed ``uint8`` codes ``(n, K/8)``: ``offsets`` ``(m, 2**key_bits + 1)``
    ``uint32`` and ``positions``, bucket ``b`` of table ``t`` holding the rows at
    ``offsets[t, b]:offsets[t, b + 1]`` of table ``t``'s positions, in insertion order (a stable
    counting sort of each row's key: the first ``key_bits`` bits of substring ``t``). Positions are
    bit-packed, :func:`position_bits` (n) bits each, ``(m, words)`` ``uint64``
    (:func:`unpack_positions` reads them back)."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    n, width = packed.shape
    if n >= 2**32:
        raise ValueError(f"a table addresses fewer than 2**32 items, got {n}; split the codes into several indexes")
    if not 1 <= key_bits <= 32:
        raise ValueError(f"key_bits must be in 1..32, got {key_bits}")
    offsets = np.zeros((len(starts), (1 << key_bits) + 1), dtype=np.uint32)
    positions = np.zeros((len(starts), packed_words(n)), dtype=np.uint64)
    _build(packed.reshape(-1), width, n, np.asarray(starts, np.int64), key_bits, offsets, positions, position_bits(n))
    return offsets, positions


@numba.njit(cache=True, nogil=True)
def _probe_steps(q_bytes, q_words, db_bytes, db_words, width, words, bits, starts, key_bits, offsets, positions,
                 k, radius, work_limit, cand_d, cand_p):  # fmt: skip  # pragma: no cover - compiled
    """One query's multi-index search. With ``k`` > 0: until ``k`` items lie within the radius the
    steps guarantee; with ``k`` = 0: until every item within ``radius`` is found. Returns
    (candidates, their count, the threshold, finished); ``finished`` is False when the work (probes
    plus items read) passed ``work_limit`` first."""
    m = starts.shape[0]
    n = db_bytes.shape[0] // width
    pos_bits = position_bits(n)
    q_keys = np.empty(m, np.uint64)
    for t in range(m):
        q_keys[t] = _key(q_bytes, 0, width, starts[t], key_bits)
    hist = np.zeros(bits + 1, np.int64)
    threshold = radius if k == 0 else bits
    size = 0
    work = 0
    combo = np.empty(key_bits + 1, np.int64)
    for rho in range(key_bits + 1):
        for t in range(m):
            for i in range(rho):
                combo[i] = i
            while True:
                mask = np.uint64(0)
                for i in range(rho):
                    mask |= np.uint64(1) << np.uint64(combo[i])
                key = q_keys[t] ^ mask
                lo, hi = offsets[t, key], offsets[t, key + np.uint64(1)]
                work += 1 + np.int64(hi - lo)
                for s in range(lo, hi):
                    x = _position(positions, t, s, pos_bits)
                    d = _row_distance(q_words, db_words, words, x)
                    if d > threshold:
                        continue
                    first = True  # found before, at a smaller key distance or an earlier table?
                    for u in range(m):
                        if u != t:
                            du = popcount(_key(db_bytes, x * np.uint64(width), width, starts[u], key_bits) ^ q_keys[u])
                            if du < rho or (u < t and du == rho):
                                first = False
                                break
                    if not first:
                        continue
                    if size == cand_d.shape[0]:
                        kept = 0
                        for c in range(size):
                            if cand_d[c] <= threshold:
                                cand_d[kept], cand_p[kept] = cand_d[c], cand_p[c]
                                kept += 1
                        size = kept
                        if size * 2 > cand_d.shape[0]:
                            grown_d, grown_p = np.empty(cand_d.shape[0] * 2, cand_d.dtype), np.empty(cand_d.shape[0] * 2, cand_p.dtype)
                            grown_d[:size], grown_p[:size] = cand_d[:size], cand_p[:size]
                            cand_d, cand_p = grown_d, grown_p
                    cand_d[size], cand_p[size] = d, x
                    size += 1
                    hist[d] += 1
                    if k > 0 and d < threshold:
                        seen = 0
                        for e in range(bits + 1):
                            seen += hist[e]
                            if seen >= k:
                                threshold = e
                                break
                # the next combination of rho bit positions among key_bits
                i = rho - 1
                while i >= 0 and combo[i] == key_bits - rho + i:
                    i -= 1
                if i < 0:
                    break
                combo[i] += 1
                for j in range(i + 1, rho):
                    combo[j] = combo[j - 1] + 1
                if work > work_limit:
                    return cand_d, cand_p, size, threshold, False
            covered = m * rho + t  # every item within this distance has been found
            if k == 0:
                if covered >= radius:
                    return cand_d, cand_p, size, threshold, True
            else:
                seen = 0
                for e in range(min(covered, bits) + 1):
                    seen += hist[e]
                if seen >= k:
                    return cand_d, cand_p, size, threshold, True
            if work > work_limit:
                return cand_d, cand_p, size, threshold, False
            if rho >= 1 and t == m - 1 and (k == 0 or threshold < bits):
                # after each round from key distance 1, give up at once when the probes still needed
                # to reach the k-th candidate's distance (the radius) would alone pass the limit
                budget = work_limit - work
                per_probe = 1.0 + n / (1 << key_bits)  # a probe and its bucket's items on average
                if _probes_ahead(m, key_bits, rho, t, radius if k == 0 else threshold, budget / per_probe) * per_probe > budget:
                    return cand_d, cand_p, size, threshold, False
    return cand_d, cand_p, size, threshold, True


@numba.njit(cache=True, nogil=True)
def _probes_ahead(m, key_bits, rho, t, target, most):  # pragma: no cover - compiled
    """Probes of the steps after ``(rho, t)`` up to the first that covers ``target`` (``m * rho' + t'
    >= target``: the k-th candidate's distance bounds the answer's), counted until they pass ``most``:
    a query that would need more gives up early (on uniform codes, at once) instead of reaching its
    work limit before its scan."""
    total, binomial, r, u = 0.0, 1.0, rho, t
    for i in range(r):
        binomial = binomial * (key_bits - i) / (i + 1)
    while True:
        u += 1
        if u == m:
            u, r = 0, r + 1
            if r > key_bits:
                return total
            binomial = binomial * (key_bits - r + 1) / r
        total += binomial
        if total > most or m * r + u >= target:
            return total


@numba.njit(cache=True, nogil=True)
def _nearest(cand_d, cand_p, size, threshold):  # pragma: no cover - compiled
    """The candidates within ``threshold``, by distance, ties by position (insertion order)."""
    keys = np.empty(size, np.int64)
    kept = 0
    for c in range(size):
        if cand_d[c] <= threshold:
            keys[kept] = (np.int64(cand_d[c]) << np.int64(40)) | np.int64(cand_p[c])
            kept += 1
    return np.sort(keys[:kept])


@numba.njit(cache=True, nogil=True)
def _knn_one(q, query_bytes, query_words, db_bytes, db_words, width, words, bits, starts, key_bits, offsets, positions, k,
             work_limit, out_d, out_p, finished):  # fmt: skip  # pragma: no cover - compiled
    """Query ``q``'s k nearest into row ``q`` of the outputs."""
    cand_d, cand_p = np.empty(max(4 * k, 256), np.int32), np.empty(max(4 * k, 256), np.int64)
    cand_d, cand_p, size, threshold, done = _probe_steps(query_bytes[q], query_words[q], db_bytes, db_words, width, words,
                                                         bits, starts, key_bits, offsets, positions, k, 0, work_limit,
                                                         cand_d, cand_p)  # fmt: skip
    finished[q] = done
    if done:
        keys = _nearest(cand_d, cand_p, size, threshold)
        for j in range(k):
            out_d[q, j] = keys[j] >> 40
            out_p[q, j] = keys[j] & ((np.int64(1) << 40) - 1)


@numba.njit(cache=True, nogil=True)
def _knn_serial(query_bytes, query_words, db_bytes, db_words, width, words, bits, starts, key_bits, offsets, positions, k,
                work_limit, out_d, out_p, finished):  # fmt: skip  # pragma: no cover - compiled
    """Every query on the calling thread (the GIL released: concurrent callers run in parallel)."""
    for q in range(query_bytes.shape[0]):
        _knn_one(q, query_bytes, query_words, db_bytes, db_words, width, words, bits, starts, key_bits, offsets, positions, k,
                 work_limit, out_d, out_p, finished)  # fmt: skip


@numba.njit(cache=True, nogil=True, parallel=True)
def _knn_parallel(query_bytes, query_words, db_bytes, db_words, width, words, bits, starts, key_bits, offsets, positions, k,
                  work_limit, out_d, out_p, finished):  # fmt: skip  # pragma: no cover - compiled
    """The queries spread over numba's threads."""
    for q in numba.prange(query_bytes.shape[0]):
        _knn_one(q, query_bytes, query_words, db_bytes, db_words, width, words, bits, starts, key_bits, offsets, positions, k,
                 work_limit, out_d, out_p, finished)  # fmt: skip


@numba.njit(cache=True, nogil=True)
def _within(query_bytes, query_words, db_bytes, db_words, width, words, bits, starts, key_bits, offsets, positions,
            k, radius, work_limit, found, finished):  # fmt: skip  # pragma: no cover - compiled
    """Each query's rows within ``radius`` (``k`` = 0), or within its k-th distance (ties included:
    when the steps stop, every row within the k-th candidate's distance has been found)."""
    for q in range(query_bytes.shape[0]):  # serial: each query's answer replaces an item of a typed list
        cand_d, cand_p = np.empty(max(4 * k, 256), np.int32), np.empty(max(4 * k, 256), np.int64)
        cand_d, cand_p, size, threshold, done = _probe_steps(query_bytes[q], query_words[q], db_bytes, db_words, width, words,
                                                             bits, starts, key_bits, offsets, positions, k, radius,
                                                             work_limit, cand_d, cand_p)  # fmt: skip
        finished[q] = done
        if done:
            found[q] = _nearest(cand_d, cand_p, size, threshold)


def _views(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Bytes and words of packed rows, writeable (numba compiles every kernel anew for read-only
    arrays, seconds on first use: queries decoded from a request's bytes are copied)."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    if not packed.flags.writeable:
        packed = packed.copy()
    words = code_words(packed)
    return packed, words, packed.shape[1], words.shape[1]


def mih_knn(query_packed: np.ndarray, db_packed: np.ndarray, starts: np.ndarray, key_bits: int, offsets: np.ndarray,
            positions: np.ndarray, k: int, work_limit: int, threads: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Exact Hamming k-NN of packed queries over ``db_packed`` through its tables
    (:func:`build_tables`), ``1 <= k <= n``: ``int32`` distances and ``int64`` row positions
    ``(queries, k)``, nearest first, ties in insertion order, and ``finished`` ``(queries,)``: False
    where a query's work passed ``work_limit`` (its rows are then undefined; scan it instead).
    ``threads`` as in :func:`tfhash.hamming.knn_search` (a batch is spread over them, one query a
    thread; a single query runs on the calling thread).

    A query probes the buckets whose keys lie at distance 0, 1, 2, ... from its own, table after
    table. After the step at key distance ``rho`` in table ``t`` every item within ``m * rho + t``
    has been found (the refined bound of Sec. 4: an item missed has key distances above ``rho`` in
    tables ``0..t`` and at least ``rho`` in the others, and its distance is at least their sum), so
    the search stops once ``k`` found items lie within that radius. An item is counted once without
    a set: it is taken only at the first step that can find it (its smallest key distance, in the
    first table at it). On clustered codes (as learned ones are) the k-th neighbour is near and a
    query reads a few buckets; on uniform random ones it is far and the probes multiply, hence
    ``work_limit`` (probes plus items read)."""
    queries, query_words, width, words = _views(query_packed)
    db, db_words, _, _ = _views(db_packed)
    _check_k(k, db.shape[0])
    out_d = np.zeros((queries.shape[0], k), np.int32)
    out_p = np.zeros((queries.shape[0], k), np.int64)
    finished = np.zeros(queries.shape[0], np.bool_)
    run = _knn_serial if queries.shape[0] == 1 or search_threads(threads) == 1 else _knn_parallel
    run(queries, query_words, db.reshape(-1), db_words.reshape(-1), width, words, width * 8, np.asarray(starts, np.int64),
        key_bits, offsets, positions, k, work_limit, out_d, out_p, finished)  # fmt: skip
    return out_d, out_p, finished


def mih_range(query_packed: np.ndarray, db_packed: np.ndarray, starts: np.ndarray, key_bits: int, offsets: np.ndarray,
              positions: np.ndarray, radius: int, work_limit: int) -> tuple[list, np.ndarray]:  # fmt: skip
    """Every row within Hamming distance ``radius`` (inclusive) of each packed query, through the
    tables: per query an ``(distances int32, positions int64)`` pair by distance, ties in insertion
    order, and ``finished`` as in :func:`mih_knn` (None in place of an unfinished query's pair)."""
    return _found_within(query_packed, db_packed, starts, key_bits, offsets, positions, 0, radius, work_limit)


def mih_knn_ties(query_packed: np.ndarray, db_packed: np.ndarray, starts: np.ndarray, key_bits: int, offsets: np.ndarray,
                 positions: np.ndarray, k: int, work_limit: int) -> tuple[list, np.ndarray]:  # fmt: skip
    """Every row within each packed query's k-th smallest distance, the ties at it included, in one
    search (as :func:`tfhash.hamming.knn_ties_search` in one scan), ``1 <= k <= n``: per query a pair
    as :func:`mih_range` returns, and ``finished`` as in :func:`mih_knn`."""
    _check_k(k, np.shape(db_packed)[0])
    return _found_within(query_packed, db_packed, starts, key_bits, offsets, positions, k, 0, work_limit)


def _found_within(query_packed, db_packed, starts, key_bits, offsets, positions, k, radius, work_limit):
    queries, query_words, width, words = _views(query_packed)
    db, db_words, _, _ = _views(db_packed)
    found = numba.typed.List([np.zeros(0, np.int64) for _ in range(queries.shape[0])])
    finished = np.zeros(queries.shape[0], np.bool_)
    _within(queries, query_words, db.reshape(-1), db_words.reshape(-1), width, words, width * 8, np.asarray(starts, np.int64),
            key_bits, offsets, positions, k, radius, work_limit, found, finished)  # fmt: skip
    low = (1 << 40) - 1
    return [((keys >> 40).astype(np.int32), keys & low) if done else None for keys, done in zip(found, finished, strict=True)], finished
