"""Retrieval metrics over binary codes: the project's one definition (docs/design.md s.3).

Every metric shares two conventions (docs/metrics.md compares them with other hashing code bases):
a database item is relevant to a query when they share at least one label, and the ranking is by
ascending Hamming distance, ties by ascending database index (stable). Each metric's own
definition is in its function's docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numba
import numpy as np

from tfhash.metrics.kernels import ranking_statistics
from tfhash.metrics.ranking import prepare

__all__ = ["RetrievalReport", "evaluate_retrieval", "evaluate_retrieval_sharded", "average_precision", "mean_average_precision", "mean_average_precision_tie_aware", "precision_at_hamming_radius", "precision_at_n", "pr_curve_by_radius", "precision_at_n_curve", "cross_modal_mean_average_precision"]


def _harmonic_numbers(n: int) -> np.ndarray:
    """H[0..n] with H[0] = 0 and H[k] = 1 + 1/2 + ... + 1/k (float64)."""
    return np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1, dtype=np.float64))])


def tie_aware_average_precision(counts: np.ndarray, relevant_counts: np.ndarray, harmonic: np.ndarray) -> np.ndarray:
    """Expected AP over random orders within each Hamming-distance tie, from histograms.

    For a tie group of ``m`` items with ``t`` relevant, preceded by ``n`` items of which ``r`` are
    relevant, a relevant item at position k of the group has, in expectation, ``r + 1 +
    (k - 1)(t - 1)/(m - 1)`` relevant items at or before it and rank ``n + k``; averaging over the
    uniformly random position k gives the group's contribution

        t/m * [ (r + 1) S0 + (t - 1)/(m - 1) S1 ],  S0 = H(n+m) - H(n),  S1 = m - (n + 1) S0,

    with H the harmonic numbers. AP = sum of contributions / total relevant (0 when none).

    Args:
        counts, relevant_counts: ``(q, K + 1)`` items / relevant items at each distance.
        harmonic: :func:`_harmonic_numbers` of at least the database size.
    """
    counts = counts.astype(np.float64)
    relevant_counts = relevant_counts.astype(np.float64)
    before = np.cumsum(counts, axis=1) - counts
    relevant_before = np.cumsum(relevant_counts, axis=1) - relevant_counts
    before_i = before.astype(np.int64)
    s0 = harmonic[before_i + counts.astype(np.int64)] - harmonic[before_i]
    s1 = counts - (before + 1.0) * s0
    with np.errstate(divide="ignore", invalid="ignore"):
        pair_term = np.where(counts > 1, (relevant_counts - 1.0) / (counts - 1.0) * s1, 0.0)
        group = np.where(counts > 0, relevant_counts / counts * ((relevant_before + 1.0) * s0 + pair_term), 0.0)
    total = relevant_counts.sum(axis=1)
    return np.where(total > 0, group.sum(axis=1) / np.maximum(total, 1.0), 0.0)


@dataclass
class RetrievalReport:
    """Per-query values of one evaluation and their summaries.

    Arrays have one entry per query (``precision_by_radius`` / ``recall_by_radius`` /
    ``ball_size_by_radius``: one row per query, one column per radius 0..K).
    ``tie_aware_average_precision`` is ``None`` unless asked for.
    """

    bits: int
    num_queries: int
    num_database: int
    top_r: int | None
    average_precision: np.ndarray | None = None
    tie_aware_average_precision: np.ndarray | None = None
    precision_by_radius: np.ndarray | None = None
    recall_by_radius: np.ndarray | None = None
    ball_size_by_radius: np.ndarray | None = None
    precision_at: dict[int, np.ndarray] = field(default_factory=dict)

    def mean_average_precision(self) -> float:
        return float(np.mean(self.average_precision)) if self.num_queries else 0.0

    def precision_at_radius(self, radius: int) -> float:
        column = min(radius, self.bits)
        return float(np.mean(self.precision_by_radius[:, column])) if self.num_queries else 0.0

    def nonempty_ball_share(self, radius: int) -> float:
        column = min(radius, self.bits)
        return float(np.mean(self.ball_size_by_radius[:, column] > 0)) if self.num_queries else 0.0

    def summary(self, radius: int = 2) -> dict:
        """Scalar summary (JSON-ready)."""
        out: dict = {"bits": self.bits, "queries": self.num_queries, "database": self.num_database}
        label = "all" if self.top_r is None else str(self.top_r)
        if self.average_precision is not None:
            out[f"mAP@{label}"] = self.mean_average_precision()
        if self.tie_aware_average_precision is not None:
            out["mAP@all (tie-aware)"] = float(np.mean(self.tie_aware_average_precision))
        if self.precision_by_radius is not None:
            out[f"P@H<={radius}"] = self.precision_at_radius(radius)
            out[f"nonempty ball share (H<={radius})"] = self.nonempty_ball_share(radius)
        for n, values in sorted(self.precision_at.items()):
            out[f"P@{n}"] = float(np.mean(values))
        return out


def evaluate_retrieval(
    query_codes,
    db_codes,
    query_labels,
    db_labels,
    *,
    top_r: int | None = None,
    tie_aware: bool = False,
    precision_at: Sequence[int] = (),
) -> RetrievalReport:
    """Compute every metric per query in one compiled pass over the database per query
    (:mod:`tfhash.metrics.kernels`): AP@R in the stable tie order, P@N, and the distance
    histograms from which the radius curves and the tie-aware AP follow. Memory is O(queries x K)
    plus O(database) scratch per thread: nothing of size queries x database.

    Args:
        query_codes, db_codes: +-1 codes ``(n, K)`` or packed ``uint8`` ``(n, K/8)``.
        query_labels, db_labels: class ids ``(n,)`` or one-hot / multi-hot ``(n, C)``.
        top_r: depth R of AP@R; ``None`` means the whole database (mAP@all).
        tie_aware: also compute the tie-aware AP (whole ranking only).
        precision_at: the N of the P@N values to compute.

    Raises:
        ValueError: invalid inputs (see :func:`tfhash.metrics.ranking.prepare`), ``top_r`` or an
            N outside ``1..database size``, or ``tie_aware`` with a ``top_r``.
    """
    problem = prepare(query_codes, db_codes, query_labels, db_labels)
    ns = _check_depths(problem.num_database, top_r, tie_aware, precision_at)
    statistics = _Statistics.zeros(problem.num_queries, problem.bits, ns)
    statistics.visit(problem, problem.num_database if top_r is None else int(top_r), ns)
    return statistics.report(problem.num_database, top_r, tie_aware, ns)


def evaluate_retrieval_sharded(
    query_codes,
    query_labels,
    shards: Callable[[], Iterable[tuple]],
    *,
    top_r: int | None = None,
    tie_aware: bool = False,
    precision_at: Sequence[int] = (),
) -> RetrievalReport:
    """:func:`evaluate_retrieval` over a database read in shards, with exactly its numbers (ties
    broken by the database's global order: the order of the shards, then of the rows in each).
    Memory is O(queries x K) plus one shard.

    Two passes (:mod:`tfhash.metrics.kernels`): the first counts, per query, the items and the
    relevant items at each Hamming distance over the whole database; the second visits each shard
    with its buckets starting where the items before it end, so every item gets its global rank,
    and adds up AP's sums, the hits at each N and the histograms.

    Args:
        query_codes, query_labels: as :func:`evaluate_retrieval`.
        shards: called once per pass, returns the shards in the database's order, each
            ``(db_codes, db_labels)`` as :func:`evaluate_retrieval` takes them; empty shards are
            skipped. Both passes must yield the same shards.
        top_r, tie_aware, precision_at: as :func:`evaluate_retrieval`.

    Raises:
        ValueError: as :func:`evaluate_retrieval` for each shard (codes as wide as the queries',
            ...) and for the whole (the database size is the shards' total; no rows at all is an
            empty database); shards that differ between the two passes.
    """
    totals, sizes = None, []
    for problem in _shard_problems(query_codes, query_labels, shards):
        bits = problem.bits
        totals = _Statistics.zeros(problem.num_queries, bits, np.zeros(0, np.int64)) if totals is None else totals
        totals.visit(problem, problem.num_database, totals.ns)
        sizes.append(problem.num_database)
    if totals is None:
        raise ValueError("the database has no rows: every shard is empty")
    n_db = int(sum(sizes))
    ns = _check_depths(n_db, top_r, tie_aware, precision_at)
    statistics = _Statistics.zeros(totals.counts.shape[0], bits, ns)
    before = np.cumsum(totals.counts, axis=1) - totals.counts  # items at smaller distances, whole database
    relevant_before = np.cumsum(totals.relevant_counts, axis=1) - totals.relevant_counts
    index = -1
    for index, problem in enumerate(_shard_problems(query_codes, query_labels, shards)):
        if index >= len(sizes) or problem.num_database != sizes[index]:
            raise ValueError(f"shard {index} differs between the two passes over the shards; give the same shards each time")
        statistics.visit(problem, n_db if top_r is None else int(top_r), ns,
                         before + statistics.counts, relevant_before + statistics.relevant_counts)  # fmt: skip
    if index + 1 != len(sizes):
        raise ValueError(f"the second pass over the shards yielded {index + 1} shards, the first {len(sizes)}")
    return statistics.report(n_db, top_r, tie_aware, ns)


def _shard_problems(query_codes, query_labels, shards):
    for db_codes, db_labels in shards():
        if len(db_codes) or len(db_labels):
            yield prepare(query_codes, db_codes, query_labels, db_labels)


def _check_depths(n_db: int, top_r: int | None, tie_aware: bool, precision_at: Sequence[int]) -> np.ndarray:
    """The sorted N of P@N, once ``top_r`` and every N lie in 1..``n_db``."""
    for name, value in [("top_r", top_r)] + [("precision_at N", n) for n in precision_at]:
        if value is not None and not (1 <= int(value) <= n_db):
            raise ValueError(f"{name} = {value} must lie in 1..{n_db} (the database size)")
    if tie_aware and top_r is not None:
        raise ValueError("the tie-aware AP is defined here for the whole ranking only (top_r=None)")
    return np.array(sorted({int(n) for n in precision_at}), dtype=np.int64)


@dataclass
class _Statistics:
    """The kernel's per-query outputs, summed over the shards visited (in order)."""

    precision_sums: np.ndarray
    depth_hits: np.ndarray
    hits_at: np.ndarray
    counts: np.ndarray
    relevant_counts: np.ndarray
    ns: np.ndarray

    @classmethod
    def zeros(cls, m: int, bits: int, ns: np.ndarray) -> _Statistics:
        return cls(np.zeros(m), np.zeros(m, np.int64), np.zeros((m, ns.size), np.int64), np.zeros((m, bits + 1), np.int64),
                   np.zeros((m, bits + 1), np.int64), ns)  # fmt: skip

    def visit(self, problem, depth: int, ns: np.ndarray, base=None, relevant_base=None) -> None:
        """Add one database's (or shard's, ranked from ``base``) statistics."""
        m, width = problem.num_queries, problem.bits + 1
        if not m:
            return
        counts, relevant_counts = np.zeros((m, width), np.int64), np.zeros((m, width), np.int64)
        empty = np.zeros((0, width), np.int64)
        ranking_statistics(problem.query_words, problem.db_words, problem.query_labels, problem.db_labels, problem.bits,
                           depth, ns, min(numba.get_num_threads(), m),
                           empty if base is None else np.ascontiguousarray(base, np.int64),
                           empty if relevant_base is None else np.ascontiguousarray(relevant_base, np.int64),
                           self.precision_sums, self.depth_hits, self.hits_at, counts, relevant_counts)  # fmt: skip
        self.counts += counts
        self.relevant_counts += relevant_counts

    def report(self, n_db: int, top_r: int | None, tie_aware: bool, ns: np.ndarray) -> RetrievalReport:
        m, bits = self.counts.shape[0], self.counts.shape[1] - 1
        ball = np.cumsum(self.counts, axis=1)
        hits = np.cumsum(self.relevant_counts, axis=1)
        total = hits[:, -1:]
        report = RetrievalReport(bits, m, n_db, top_r)
        report.average_precision = np.where(self.depth_hits > 0, self.precision_sums / np.maximum(self.depth_hits, 1), 0.0)
        report.precision_by_radius = np.where(ball > 0, hits / np.maximum(ball, 1), 0.0)
        report.recall_by_radius = np.where(total > 0, hits / np.maximum(total, 1), 0.0)
        report.ball_size_by_radius = ball
        report.precision_at = {int(n): self.hits_at[:, t] / n for t, n in enumerate(ns)}
        if tie_aware:
            report.tie_aware_average_precision = tie_aware_average_precision(self.counts, self.relevant_counts, _harmonic_numbers(n_db))
        return report


def average_precision(query_codes, db_codes, query_labels, db_labels, top_r: int | None = None, **kwargs) -> np.ndarray:
    """Per-query AP@R (``top_r=None``: whole ranking), stable tie order.

    AP@R = sum_r P(r) rel_r / sum_r rel_r over the top R, and 0 when the top R holds no relevant
    item.
    """
    return evaluate_retrieval(query_codes, db_codes, query_labels, db_labels, top_r=top_r, **kwargs).average_precision


def mean_average_precision(query_codes, db_codes, query_labels, db_labels, top_r: int | None = None, **kwargs) -> float:
    """mAP@R over all queries (queries without relevant items count as 0), stable tie order.

    Codes are +-1 ``(n, K)`` or packed ``uint8`` ``(n, K/8)``; labels are class ids ``(n,)`` or
    one-hot / multi-hot ``(n, C)``; ``top_r=None`` ranks the whole database (mAP@all).
    """
    return float(np.mean(average_precision(query_codes, db_codes, query_labels, db_labels, top_r, **kwargs)))


def mean_average_precision_tie_aware(query_codes, db_codes, query_labels, db_labels, **kwargs) -> float:
    """Tie-aware mAP@all: expected AP over random orders within distance ties; immune to the
    database order (docs/design.md s.3).

    The expected AP over uniformly random orders inside each distance tie (McSherry and Najork,
    ECIR 2008), computed exactly from the distance histograms in O(n + K) per query
    (:func:`tie_aware_average_precision`).
    """
    report = evaluate_retrieval(query_codes, db_codes, query_labels, db_labels, tie_aware=True, **kwargs)
    return float(np.mean(report.tie_aware_average_precision)) if report.num_queries else 0.0


def precision_at_hamming_radius(query_codes, db_codes, query_labels, db_labels, radius: int = 2, **kwargs) -> float:
    """Mean over queries of the precision inside the Hamming ball d <= radius (empty ball = 0).

    The precision of a ball is relevant / retrieved among the items at distance d <= radius.
    """
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    report = evaluate_retrieval(query_codes, db_codes, query_labels, db_labels, **kwargs)
    return report.precision_at_radius(radius)


def precision_at_n(query_codes, db_codes, query_labels, db_labels, n: int, **kwargs) -> float:
    """Mean over queries of the precision of the top ``n`` of the stable ranking.

    P@N is the number of relevant items among the top N of the ranking, divided by N.
    """
    report = evaluate_retrieval(query_codes, db_codes, query_labels, db_labels, precision_at=[n], **kwargs)
    return float(np.mean(report.precision_at[int(n)])) if report.num_queries else 0.0


def pr_curve_by_radius(query_codes, db_codes, query_labels, db_labels, **kwargs) -> dict[str, np.ndarray]:
    """Mean precision and recall of the Hamming ball for every radius 0..K.

    Per query, the precision and recall of the ball d <= r for r = 0..K, averaged over queries
    (precision of an empty ball is 0, recall of a query without relevant items is 0).
    """
    report = evaluate_retrieval(query_codes, db_codes, query_labels, db_labels, **kwargs)
    return {
        "radius": np.arange(report.bits + 1),
        "precision": report.precision_by_radius.mean(axis=0),
        "recall": report.recall_by_radius.mean(axis=0),
    }


def precision_at_n_curve(query_codes, db_codes, query_labels, db_labels, ns: Sequence[int], **kwargs) -> dict[str, np.ndarray]:
    """Mean P@N for each N of ``ns`` (the top-N precision curve)."""
    report = evaluate_retrieval(query_codes, db_codes, query_labels, db_labels, precision_at=list(ns), **kwargs)
    ns_sorted = sorted({int(n) for n in ns})
    return {"n": np.array(ns_sorted), "precision": np.array([report.precision_at[n].mean() for n in ns_sorted])}


def cross_modal_mean_average_precision(
    query_codes: dict[str, np.ndarray],
    db_codes: dict[str, np.ndarray],
    query_labels,
    db_labels,
    top_r: int | None = None,
    **kwargs,
) -> dict[str, float]:
    """mAP of every direction between two modalities, e.g. ``{"image->text": .., "text->image": ..}``.

    Args:
        query_codes, db_codes: modality name -> codes; both dicts must name the same two modalities.
    """
    if set(query_codes) != set(db_codes) or len(query_codes) != 2:
        raise ValueError("cross-modal retrieval needs the same two modalities for queries and database")
    first, second = sorted(query_codes)
    return {
        f"{a}->{b}": mean_average_precision(query_codes[a], db_codes[b], query_labels, db_labels, top_r, **kwargs)
        for a, b in ((first, second), (second, first))
    }
