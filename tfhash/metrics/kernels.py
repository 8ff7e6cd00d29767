"""Compiled per-query ranking statistics: AP@R, hits in the top N and distance histograms in one
pass over the database, without sorting and without any queries x database matrix.

For each query, one visit of the database builds the distance histograms and a pass over the
relevant items turns them into ranks: O(n + K) per query. Queries are split over the available
threads; compiled with numba (cached on disk after the first call). A database in shards gives the
same sums as the whole (:func:`ranking_statistics`).
"""

from __future__ import annotations

import numba
import numpy as np

from tfhash.hamming import popcount

__all__ = ["ranking_statistics"]


@numba.njit(cache=True, nogil=True, parallel=True)
def ranking_statistics(query_words, db_words, query_labels, db_labels, bits, depth, ns, threads, base, relevant_base,
                       precision_sums, depth_hits, hits_at, counts_out, relevant_counts_out):  # pragma: no cover - compiled  # fmt: skip
    """Add, for every query i, to ``precision_sums[i]`` and ``depth_hits[i]`` (the sum of P(rank)
    over the relevant items in the top ``depth``, in database order, and their number: AP@depth is
    their ratio) and to ``hits_at[i, t]`` (relevant items in the top ``ns[t]``); fill
    ``counts_out[i, h]`` / ``relevant_counts_out[i, h]`` (database items / relevant items at
    distance h). Adding shard after shard to the same sums keeps the whole database's order of
    additions, so the sums are bit-identical to one visit of the whole.

    For each query, database items are visited in index order. The Hamming distance is the
    hardware popcount of the XOR of packed words (:func:`tfhash.hamming.popcount`, LLVM ``ctpop``);
    relevance is a non-empty AND of label bitmasks. With ties broken by database index
    (docs/design.md s.3) the rank of item j at distance h is ``(items at distance < h) + (items at
    distance h with index <= j)``, and the number of relevant items ranked at or before a relevant
    j is ``(relevant at distance < h) + (relevant at distance h with index <= j)``. The visit builds
    the two histograms (K + 1 bins) and notes, at each relevant item, its bucket and both
    within-bucket counts (the histogram values at that moment); a pass over the relevant items
    alone then turns those into ranks. O(n + K) per query; each thread owns scratch arrays of n
    entries.

    A database in shards (in its global order) gives the same ranks when each shard's visit starts
    its buckets at ``base[h]`` = (items at distance < h in the whole database) + (items at distance
    h in the shards before it), and likewise for the relevant items (``relevant_base``): AP's sums
    and hit counts then add up over shards
    (:func:`tfhash.metrics.retrieval.evaluate_retrieval_sharded`).

    Args:
        query_words, db_words: packed codes as words (:func:`tfhash.hamming.code_words`).
        query_labels, db_labels: ``uint64`` label bitmasks, one or more words per row.
        bits: K.  depth: R of AP@R.  ns: ``int64`` N of P@N.  threads: number of row blocks.
        base, relevant_base: ``int64 (m, K + 1)``: the items (relevant items) ranked before this
            database's first item at each distance, for a shard of a larger database (see
            above); ``(0, K + 1)`` for a whole database.
    """
    m = query_words.shape[0]
    n = db_words.shape[0]
    code_words = query_words.shape[1]
    label_words = query_labels.shape[1]
    width = bits + 1
    for block in numba.prange(threads):
        bucket = np.empty(n, np.int32)
        position = np.empty(n, np.int64)
        relevant_position = np.empty(n, np.int64)
        starts = np.empty(width, np.int64)
        relevant_starts = np.empty(width, np.int64)
        for i in range(block, m, threads):
            counts = counts_out[i]
            relevant_counts = relevant_counts_out[i]
            counts[:] = 0
            relevant_counts[:] = 0
            found = 0
            for j in range(n):
                h = 0
                for w in range(code_words):
                    h += popcount(query_words[i, w] ^ db_words[j, w])
                counts[h] += 1
                shared = False
                for w in range(label_words):
                    if query_labels[i, w] & db_labels[j, w]:
                        shared = True
                        break
                if shared:
                    relevant_counts[h] += 1
                    bucket[found] = h
                    position[found] = counts[h]
                    relevant_position[found] = relevant_counts[h]
                    found += 1
            if base.shape[0] > 0:
                for h in range(width):
                    starts[h] = base[i, h]
                    relevant_starts[h] = relevant_base[i, h]
            else:
                starts[0] = 0
                relevant_starts[0] = 0
                for h in range(1, width):
                    starts[h] = starts[h - 1] + counts[h - 1]
                    relevant_starts[h] = relevant_starts[h - 1] + relevant_counts[h - 1]
            total = precision_sums[i]
            hits = depth_hits[i]
            for r in range(found):
                h = bucket[r]
                rank = starts[h] + position[r]
                if rank <= depth:
                    hits += 1
                    total += (relevant_starts[h] + relevant_position[r]) / rank
                for t in range(ns.size):
                    if rank <= ns[t]:
                        hits_at[i, t] += 1
            precision_sums[i] = total
            depth_hits[i] = hits
