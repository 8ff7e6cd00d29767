"""Standard retrieval splits (docs/design.md s.5), deterministic from a seed.

Every split shuffles with ``numpy.random.default_rng(seed)`` so that no part is stored in label
order (docs/design.md s.3 explains why that matters for tie order) and records the seed it used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Split", "per_class_split", "random_split", "fixed_split", "validation_split"]


@dataclass(frozen=True)
class Split:
    """Index arrays into a dataset's rows. ``train`` is a subset of ``database`` unless noted."""

    query: np.ndarray
    database: np.ndarray
    train: np.ndarray
    seed: int
    protocol: str

    def describe(self) -> dict:
        return {
            "protocol": self.protocol,
            "seed": self.seed,
            "query": int(self.query.size),
            "database": int(self.database.size),
            "train": int(self.train.size),
        }


def per_class_split(
    class_ids: np.ndarray,
    queries_per_class: int = 100,
    train_per_class: int = 500,
    seed: int = 0,
) -> Split:
    """CIFAR-10 / MNIST protocol: ``queries_per_class`` queries of each class, the rest is the
    database, and ``train_per_class`` of each class of the database train.

    Raises:
        ValueError: when a class has too few examples for the request.
    """
    class_ids = np.asarray(class_ids)
    if class_ids.ndim != 1:
        raise ValueError("per_class_split needs integer class ids of shape (n,)")
    rng = np.random.default_rng(seed)
    order = rng.permutation(class_ids.size)
    shuffled = class_ids[order]
    query_mask = np.zeros(class_ids.size, dtype=bool)
    train_mask = np.zeros(class_ids.size, dtype=bool)
    for cls in np.unique(class_ids):
        positions = np.flatnonzero(shuffled == cls)
        need = queries_per_class + train_per_class
        if positions.size < need:
            raise ValueError(
                f"class {cls} has {positions.size} examples, fewer than "
                f"{queries_per_class} queries + {train_per_class} training examples"
            )
        query_mask[positions[:queries_per_class]] = True
        train_mask[positions[queries_per_class:need]] = True
    return Split(
        query=order[query_mask],
        database=order[~query_mask],
        train=order[train_mask],
        seed=seed,
        protocol=f"per-class: {queries_per_class} queries, {train_per_class} train per class",
    )


def random_split(n: int, num_query: int, num_train: int, seed: int = 0) -> Split:
    """MIRFlickr / NUS-WIDE style: ``num_query`` random queries, the rest is the database, the
    first ``num_train`` of the (shuffled) database train."""
    if num_query + num_train > n:
        raise ValueError(f"{num_query} queries + {num_train} train exceed the {n} examples")
    order = np.random.default_rng(seed).permutation(n)
    database = order[num_query:]
    return Split(
        query=order[:num_query],
        database=database,
        train=database[:num_train],
        seed=seed,
        protocol=f"random: {num_query} queries, {num_train} train from the database",
    )


def fixed_split(query: np.ndarray, database: np.ndarray, seed: int = 0) -> Split:
    """A given query / database partition (Wiki): the database also trains. The database order is
    shuffled with the seed so that it is not stored in label order."""
    rng = np.random.default_rng(seed)
    database = rng.permutation(np.asarray(database))
    return Split(
        query=np.asarray(query),
        database=database,
        train=database,
        seed=seed,
        protocol="fixed: given queries, database trains",
    )


def validation_split(train: np.ndarray, labels: np.ndarray, held_out: int, queries: int, seed: int = 0,
                     train_in_database: float = 0.0, at_random: bool = False) -> Split:  # fmt: skip
    """A validation split carved out of the training rows ``train`` (indices into ``labels``), for
    choosing hyper-parameters and epochs without the protocol's queries.

    ``held_out`` training rows leave training, per class when ``labels`` are class ids or one-hot
    rows (single-label; training then keeps as many rows per class as the smallest class has
    left), at random otherwise; ``queries`` of them (per class, or in total) are the
    validation queries and the rest the validation database. ``at_random=True`` holds rows out at
    random whatever the labels (single-label classes of uneven sizes: a share of each class in
    expectation, and training keeps every other row). ``train_in_database`` in [0, 1) adds
    training rows, drawn at random, until they are that share of the validation database: the
    protocols put the training rows in the database (8% of it on CIFAR-10, 55% on MIRFlickr), and
    ranking them against unseen rows is part of what mAP@all measures. The returned split indexes
    ``labels``.

    Raises:
        ValueError: ``queries >= held_out``, or too few training rows (of a class).
    """
    train, labels = np.asarray(train), np.asarray(labels)
    if not 0 < queries < held_out:
        raise ValueError(f"queries must be in 1..held_out-1; got queries={queries}, held_out={held_out}")
    single = (labels.ndim == 1 or bool((labels.sum(axis=1) == 1).all())) and not at_random
    if single:
        ids = labels[train] if labels.ndim == 1 else labels[train].argmax(axis=1)
        counts = np.bincount(ids)[np.unique(ids)]
        inner = per_class_split(ids, held_out, int(counts.min()) - held_out, seed=seed)
        held = train[inner.query]
        halves = per_class_split(ids[inner.query], queries, held_out - queries, seed=seed)
    else:
        inner = random_split(train.size, held_out, train.size - held_out, seed=seed)
        held = train[inner.query]
        halves = random_split(held.size, queries, held_out - queries, seed=seed)
    if not 0 <= train_in_database < 1:
        raise ValueError(f"train_in_database must be in [0, 1); got {train_in_database}")
    database, kept = held[halves.train], train[inner.train]
    extra = min(kept.size, int(round(database.size * train_in_database / (1 - train_in_database))))
    database = np.concatenate([database, np.random.default_rng(seed).choice(kept, extra, replace=False)])
    return Split(query=held[halves.query], database=database, train=kept, seed=seed,
                 protocol=f"validation: {held_out} held out of the training rows{' per class' if single else ''}, "
                          f"{queries} of them queries, {extra} training rows in the database")  # fmt: skip
