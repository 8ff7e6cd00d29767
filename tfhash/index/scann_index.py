"""ScaNN over +-1 (or continuous) codes with dot-product scoring.

For +-1 codes of K bits, ``q.x = K - 2 d_H(q, x)``, so maximum inner product search is Hamming
search; distances are reported as ``(K - q.x) / 2`` (the Hamming distance for binary queries).
Asymmetric mode: continuous queries against the binary database, same formula (no longer an
integer). ``mode="brute"`` is exact up to tie order; ``mode="ah"`` is a tree (partitioning) +
asymmetric hashing + exact reordering, approximate.

The tree is trained with k-means++ initialisation and ``clustering_seed = seed``, so a build is a
function of the codes and the parameters: an index loaded from disk (which rebuilds its tree) and
every replica of the search service answer exactly as the index did when it was saved. ScaNN's
default random initialisation is not seeded by ``clustering_seed`` and gives a different tree on
each build (measured with scann 1.3.2). k-means++ builds more slowly: 6.1 s against 3.9 s for
100,000 x 64-bit codes and 1,000 leaves in the quick evidence report (``python -m benchmarks.report
--quick``), at recall within 0.002 of the random initialisation's there and in the index benchmark.
"""

from __future__ import annotations

import os

import numpy as np

from tfhash.codes import unpack_codes
from tfhash.index.base import HashIndex, IndexError_, SearchResult, validate_ids, validate_k


class ScannIndex(HashIndex):
    """ScaNN searcher over codes with int64 external ids (rebuilt lazily after add / remove).

    Args:
        bits: K.
        mode: ``"ah"`` (tree + AH + reorder) or ``"brute"``.
        num_leaves, leaves_to_search, reorder: ScaNN tree and reordering settings (``ah``).
        training_sample_size: tree training sample.
        seed: seed of the tree's k-means (``ah``); see the module docstring.
    """

    def __init__(self, bits: int, mode: str = "ah", num_leaves: int = 1000, leaves_to_search: int = 50,
                 reorder: int = 200, training_sample_size: int = 100000, seed: int = 0):  # fmt: skip
        super().__init__(bits)
        if mode not in ("ah", "brute"):
            raise IndexError_(f"ScaNN mode must be 'ah' or 'brute', got {mode!r}")
        self.kind, self.exact, self.mode = f"scann-{mode}", False, mode
        self.num_leaves, self.leaves_to_search, self.reorder = int(num_leaves), int(leaves_to_search), int(reorder)
        self.training_sample_size, self.seed = int(training_sample_size), int(seed)
        self._vectors = np.zeros((0, bits), dtype=np.float32)
        self._ids = np.zeros(0, dtype=np.int64)
        self._searcher = None
        self._built_for_k = 0

    @property
    def ntotal(self) -> int:
        return int(self._ids.size)

    def ids(self) -> np.ndarray:
        return self._ids.copy()

    def params(self) -> dict:
        return {"mode": self.mode, "num_leaves": self.num_leaves, "leaves_to_search": self.leaves_to_search,
                "reorder": self.reorder, "training_sample_size": self.training_sample_size, "seed": self.seed}  # fmt: skip

    def _as_vectors(self, codes, name: str) -> np.ndarray:
        codes = np.asarray(codes)
        if codes.ndim != 2:
            raise IndexError_(f"{name} must be 2-D, got shape {codes.shape}")
        if codes.dtype == np.uint8:
            codes = unpack_codes(codes)
        vectors = codes.astype(np.float32)
        if vectors.shape[1] != self.bits:
            raise IndexError_(f"{name} have {vectors.shape[1]} dimensions, the index has {self.bits} bits")
        if not np.all(np.isfinite(vectors)):
            raise IndexError_(f"{name} contain NaN or infinity")
        return vectors

    def add(self, codes, ids=None) -> None:
        vectors = self._as_vectors(codes, "codes")
        if ids is None:
            start = int(self._ids.max()) + 1 if self._ids.size else 0
            ids = np.arange(start, start + vectors.shape[0])
        ids = validate_ids(ids, vectors.shape[0], self._ids)
        self._vectors = np.concatenate([self._vectors, vectors])
        self._ids = np.concatenate([self._ids, ids])
        self._searcher = None

    def remove(self, ids) -> int:
        keep = ~np.isin(self._ids, np.asarray(ids, dtype=np.int64))
        removed = int((~keep).sum())
        if removed:
            self._vectors, self._ids = self._vectors[keep], self._ids[keep]
            self._searcher = None
        return removed

    def _build(self, k: int):
        import scann

        builder = scann.scann_ops_pybind.builder(self._vectors, k, "dot_product")
        if self.mode == "brute":
            return builder.score_brute_force().build()
        leaves = max(1, min(self.num_leaves, self.ntotal // 10 or 1))
        builder = builder.tree(
            num_leaves=leaves,
            num_leaves_to_search=min(self.leaves_to_search, leaves),
            training_sample_size=min(self.training_sample_size, self.ntotal),
            random_init=False,  # k-means++, which honours clustering_seed
        )
        config = builder.score_ah(2, anisotropic_quantization_threshold=0.2).reorder(max(self.reorder, k)).create_config()
        # The builder has no seed argument; the partitioning proto's clustering_seed field takes it.
        if "partitioning {" not in config:
            raise IndexError_("this ScaNN version's config has no 'partitioning {' block to seed; see constraints/py310.txt")
        config = config.replace("partitioning {", f"partitioning {{\n        clustering_seed: {self.seed}", 1)
        return scann.scann_ops_pybind.create_searcher(self._vectors, config)

    def search(self, queries, k: int) -> SearchResult:
        vectors = self._as_vectors(queries, "queries")
        k = validate_k(k, self.ntotal)
        if self._searcher is None or k > self._built_for_k:
            self._searcher, self._built_for_k = self._build(k), k
        positions, scores = self._searcher.search_batched(vectors, final_num_neighbors=k)
        positions = np.asarray(positions, dtype=np.int64)
        distances = (self.bits - np.asarray(scores, dtype=np.float64)) / 2.0
        return SearchResult(distances, self._ids[positions])

    def write_files(self, directory) -> None:
        np.save(os.path.join(directory, "vectors.npy"), self._vectors, allow_pickle=False)
        np.save(os.path.join(directory, "ids.npy"), self._ids, allow_pickle=False)

    @classmethod
    def read_files(cls, directory, bits: int, params: dict) -> ScannIndex:
        index = cls(bits, **params)
        vectors = np.load(os.path.join(directory, "vectors.npy"), allow_pickle=False)
        ids = np.load(os.path.join(directory, "ids.npy"), allow_pickle=False)
        if vectors.shape[0]:
            index.add(vectors, ids)
        return index
