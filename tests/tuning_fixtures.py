"""Small data and the search's own choice rule, for the tuning tests."""

from __future__ import annotations

import numpy as np

from tfhash.tuning import OBJECTIVE, Budget, beats

#: A budget of three trials at most three units.
SMALL = Budget(max_units=3, trials=3)


def clusters(n_per_class: int = 60, classes: int = 5, dim: int = 24, seed: int = 0):
    """Gaussian clusters: separable enough that a short training ranks the right method well."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    y = np.repeat(np.arange(classes), n_per_class)
    return (centres[y] + rng.normal(scale=1.5, size=(len(y), dim))).astype("float32"), y


def scores(row: dict) -> dict:
    """A trial row's validation scores as the search compares them."""
    return {OBJECTIVE: row["score"], **{k: v for k, v in row.items() if k == "mAP@1000" or "->" in k}}


def chosen_row(trials: list[dict], margin: float) -> dict:
    """The trial the search should choose: the recommended recipe (the first trial) unless a trial
    of its fidelity beats it (the best such)."""
    first, rivals = trials[0], [t for t in trials[1:] if t["status"] == "ok" and t["units"] == trials[0]["units"]]
    return max([t for t in rivals if beats(scores(t), scores(first), margin)], key=lambda t: t["score"], default=first)
