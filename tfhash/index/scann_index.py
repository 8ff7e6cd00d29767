"""ScaNN over +-1 (or continuous) codes with dot-product scoring."""

from __future__ import annotations

import numpy as np

from tfhash.index.base import (
    VECTORS,
    HashIndexError,
    InProcessIndex,
    SearchResult,
    import_backend,
    require_backend,
)

__all__ = ["ScannIndex"]


METHODS = ("ah", "brute")


def distances_from_scores(scores, bits: int) -> np.ndarray:
    """``(K - q.x) / 2``: the Hamming distance when ``q`` and ``x`` are +-1 codes of K bits."""
    return (bits - np.asarray(scores, dtype=np.float64)) / 2.0


def seeded_config(config: str, seed: int) -> str:
    """A ScaNN config text whose partitioning (tree k-means) has ``clustering_seed = seed``."""
    # The builder has no seed argument; the partitioning proto's clustering_seed field takes it.
    if "partitioning {" not in config:
        raise HashIndexError("this ScaNN version's config has no 'partitioning {' block to seed; install the version pinned in constraints/py310.txt")
    return config.replace("partitioning {", f"partitioning {{\n        clustering_seed: {seed}", 1)


class ScannIndex(InProcessIndex):
    """ScaNN searcher over codes with int64 external ids (rebuilt lazily after add / remove).

    For +-1 codes of K bits, ``q.x = K - 2 d_H(q, x)``, so maximum inner product search is Hamming
    search; distances are reported as ``(K - q.x) / 2`` (the Hamming distance for binary queries).
    Asymmetric mode: continuous queries against the binary database, same formula (no longer an
    integer). Method ``brute`` is exact up to tie order; method ``ah`` is a tree (partitioning) +
    asymmetric hashing + exact reordering, approximate.

    The tree is trained with k-means++ initialisation and ``clustering_seed = seed``, so a build is a
    function of the codes and the parameters: an index loaded from disk (which rebuilds its tree) and
    every replica of the search service answer exactly as the index did when it was saved. ScaNN's
    default random initialisation is not seeded by ``clustering_seed`` and gives a different tree on
    each build (measured with scann 1.3.2). k-means++ builds more slowly: 6.1 s against 3.9 s for
    100,000 x 64-bit codes and 1,000 leaves in the quick evidence report (``python -m benchmarks.report
    --quick``), at recall within 0.002 of the random initialisation's there and in the index benchmark.

    ScaNN is imported when the searcher is first built; creating an index only checks that it is
    installed, so ``import tfhash.index`` works without it.

    Args:
        bits: K.
        method: ``"ah"`` (tree + AH + reorder) or ``"brute"``.
        num_leaves, leaves_to_search, reorder: ScaNN tree and reordering settings (``ah``).
        training_sample_size: tree training sample.
        seed: seed of the tree's k-means (``ah``); see the class docstring.

    Capabilities: none (no separate training, no range search).
    """

    format_family = "scann"
    methods = METHODS
    exact_methods = frozenset()  # brute force is exact up to tie order only
    method_param = "mode"  # the params key of format version 1
    row_layout = VECTORS
    rows_file = "vectors.npy"

    def __init__(self, bits: int, method: str = "ah", num_leaves: int = 1000, leaves_to_search: int = 50,
                 reorder: int = 200, training_sample_size: int = 100000, seed: int = 0):  # fmt: skip
        require_backend("scann", "ScannIndex")
        super().__init__(bits, method)
        self.num_leaves, self.leaves_to_search, self.reorder = int(num_leaves), int(leaves_to_search), int(reorder)
        self.training_sample_size, self.seed = int(training_sample_size), int(seed)
        self._searcher = None
        self._built_for_k = 0

    def settings(self) -> dict:
        return {"num_leaves": self.num_leaves, "leaves_to_search": self.leaves_to_search, "reorder": self.reorder,
                "training_sample_size": self.training_sample_size, "seed": self.seed}  # fmt: skip

    def _add_rows(self, rows: np.ndarray) -> None:
        self._searcher = None

    def _items_removed(self) -> None:
        self._searcher = None

    def _build(self, k: int):
        scann = import_backend("scann", "ScannIndex")
        builder = scann.scann_ops_pybind.builder(self._rows, k, "dot_product")
        if self.method == "brute":
            return builder.score_brute_force().build()
        leaves = max(1, min(self.num_leaves, self.ntotal // 10 or 1))
        builder = builder.tree(
            num_leaves=leaves,
            num_leaves_to_search=min(self.leaves_to_search, leaves),
            training_sample_size=min(self.training_sample_size, self.ntotal),
            random_init=False,  # k-means++, which honours clustering_seed
        )
        config = builder.score_ah(2, anisotropic_quantization_threshold=0.2).reorder(max(self.reorder, k)).create_config()
        return scann.scann_ops_pybind.create_searcher(self._rows, seeded_config(config, self.seed))

    def _search(self, rows: np.ndarray, k: int) -> SearchResult:
        if self._searcher is None or k > self._built_for_k:
            self._searcher, self._built_for_k = self._build(k), k
        positions, scores = self._searcher.search_batched(rows, final_num_neighbors=k)
        return SearchResult(distances_from_scores(scores, self.bits), self._ids[np.asarray(positions, dtype=np.int64)])
