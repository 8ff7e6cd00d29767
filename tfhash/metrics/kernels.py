"""Compiled per-query ranking statistics: AP@R and hits in the top N without sorting.

With ties broken by database index (DESIGN.md s.3) the rank of item j at distance h is
``(items at distance < h) + (items at distance h with index <= j)``, and the number of relevant
items ranked at or before a relevant item j is ``(relevant at distance < h) + (relevant at
distance h with index <= j)``. One pass in index order builds the distance histograms (K + 1 bins)
and, at each relevant item, notes its bucket and its two within-bucket counts (the histogram
values at that moment); a pass over the relevant items alone then turns those into ranks:
O(n + K) per query, no sort. Compiled with numba (cached on disk after the first call).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, parallel=True)
def rank_statistics(values, from_products, relevant, bits, depth, ns, average_precision, hits_at):  # pragma: no cover - compiled
    """Fill ``average_precision[i]`` (AP over the top ``depth``) and ``hits_at[i, t]`` (relevant
    items among the top ``ns[t]``) for every query row i; rows run in parallel.

    Args:
        values: ``(m, n)`` Hamming distances in 0..bits, or, with ``from_products``, the +-1 dot
            products q.x, turned into distances (K - q.x) / 2 on the fly (exact: same parity as K).
        from_products: how to read ``values``.
        relevant: ``(m, n)`` bool relevance.
        bits: K.
        depth: R of AP@R (n for the whole ranking).
        ns: ``int64`` array of the N of P@N (may be empty).
        average_precision: ``(m,)`` float64 output.
        hits_at: ``(m, len(ns))`` int64 output.
    """
    m, n = values.shape
    width = bits + 1
    for i in numba.prange(m):
        counts = np.zeros(width, np.int64)
        relevant_counts = np.zeros(width, np.int64)
        bucket = np.empty(n, np.int32)  # of each relevant item, in index order
        position = np.empty(n, np.int64)  # its place among the items of its bucket
        relevant_position = np.empty(n, np.int64)  # its place among the relevant items of its bucket
        found = 0
        for j in range(n):
            h = int((bits - values[i, j]) * 0.5 + 0.25) if from_products else int(values[i, j])
            counts[h] += 1
            if relevant[i, j]:
                relevant_counts[h] += 1
                bucket[found] = h
                position[found] = counts[h]
                relevant_position[found] = relevant_counts[h]
                found += 1
        starts = np.zeros(width, np.int64)
        relevant_starts = np.zeros(width, np.int64)
        for h in range(1, width):
            starts[h] = starts[h - 1] + counts[h - 1]
            relevant_starts[h] = relevant_starts[h - 1] + relevant_counts[h - 1]
        for t in range(ns.size):
            hits_at[i, t] = 0
        total = 0.0
        hits = 0
        for r in range(found):
            h = bucket[r]
            rank = starts[h] + position[r]
            if rank <= depth:
                hits += 1
                total += (relevant_starts[h] + relevant_position[r]) / rank
            for t in range(ns.size):
                if rank <= ns[t]:
                    hits_at[i, t] += 1
        average_precision[i] = total / hits if hits > 0 else 0.0
