"""Hash-consistent large-margin proxies (HCLM, Morgado et al., IJCV 2020, Sec. 4; docs/design.md s.4).

:func:`hclm_proxies` builds C binary proxies of K bits with a large minimum Hamming distance, each step a
small NumPy function: Tammes points (:func:`tammes_points`), an ITQ rotation (:func:`itq_rotation`), sign
and a bit-flip local search (:func:`improve_min_distance`). With a class similarity
(:func:`class_mean_similarity`, :func:`tag_cooccurrence_similarity`) it then assigns the proxies to the
classes (sHCLM, :func:`assign_proxies`).
"""

from __future__ import annotations

import logging

import numpy as np

from tfhash.labels import multi_hot

__all__ = [
    "hclm_proxies",
    "code_quality",
    "hadamard_codes",
    "lexicode",
    "assign_proxies",
    "class_mean_similarity",
    "tag_cooccurrence_similarity",
    "cooccurrence_similarity",
]

logger = logging.getLogger(__name__)


def pairwise_hamming(codes: np.ndarray) -> np.ndarray:
    """``(C, K)`` +-1 codes -> ``(C, C)`` Hamming distances (K - b_i.b_j) / 2."""
    codes = codes.astype(np.int32)
    return (codes.shape[1] - codes @ codes.T) // 2


def code_quality(codes: np.ndarray) -> dict:
    """Minimum and mean pairwise Hamming distance of a code, and the number of pairs at the minimum."""
    if codes.shape[0] < 2:
        return {"min_distance": int(codes.shape[1]), "mean_distance": float(codes.shape[1]), "pairs_at_min": 0}
    distances = pairwise_hamming(codes)[np.triu_indices(codes.shape[0], 1)]
    minimum = int(distances.min())
    return {"min_distance": minimum, "mean_distance": float(distances.mean()), "pairs_at_min": int((distances == minimum).sum())}


def tammes_points(num_classes: int, bits: int, rng: np.random.Generator, steps: int = 150) -> np.ndarray:
    """Approximate Tammes configuration: ``(C, K)`` points of norm sqrt(K).

    Minimises LSE_t(cos_ij) = (1/t) log sum_{i<j} exp(t cos_ij) by projected gradient descent with
    the temperature t raised from 5 to 80 (a smooth stand-in for the largest pairwise cosine).
    """
    points = rng.normal(size=(num_classes, bits))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    off_diagonal = ~np.eye(num_classes, dtype=bool)
    for step in range(steps):
        temperature = 5.0 * 16.0 ** (step / max(steps - 1, 1))
        cosines = points @ points.T
        logits = np.where(off_diagonal, temperature * cosines, -np.inf)
        weights = np.exp(logits - logits.max())
        weights /= weights.sum()
        gradient = 2.0 * weights @ points  # d LSE / d x_i = sum_j w_ij x_j (symmetric w)
        gradient -= (gradient * points).sum(axis=1, keepdims=True) * points  # tangent to the sphere
        scale = np.linalg.norm(gradient, axis=1, keepdims=True).max() + 1e-12
        points -= (0.1 / np.sqrt(1.0 + step / 50.0)) * gradient / scale
        points /= np.linalg.norm(points, axis=1, keepdims=True)
    return points * np.sqrt(bits)


def itq_rotation(points: np.ndarray, rng: np.random.Generator, max_iterations: int = 100) -> np.ndarray:
    """ITQ: the orthogonal R minimising ||sign(W R) - W R||^2, alternating B = sign(W R) and
    R = U V^T from the SVD of W^T B, until the error stops falling. Returns R ``(K, K)``."""
    bits = points.shape[1]
    rotation, _ = np.linalg.qr(rng.normal(size=(bits, bits)))
    best_error = np.inf
    for _ in range(max_iterations):
        projected = points @ rotation
        binary = np.where(projected >= 0, 1.0, -1.0)
        error = float(np.sum((binary - projected) ** 2))
        if error >= best_error - 1e-9:
            break
        best_error = error
        u, _, vt = np.linalg.svd(points.T @ binary)
        rotation = u @ vt
    return rotation


def _objective(distances: np.ndarray) -> tuple[int, int]:
    upper = distances[np.triu_indices(distances.shape[0], 1)]
    minimum = int(upper.min())
    return minimum, int((upper == minimum).sum())


def improve_min_distance(codes: np.ndarray, rng: np.random.Generator, max_moves: int = 20000) -> np.ndarray:
    """Bit-flip local search: repeatedly flip the single bit of a code at the minimum distance
    that most reduces the number of pairs at the minimum without creating a closer pair; when that
    number reaches zero the minimum distance has grown by one. First-improvement over the codes
    involved in closest pairs, visited in random order. Returns a new ``(C, K)`` +-1 code."""
    codes = codes.astype(np.int8).copy()
    num_classes = codes.shape[0]
    if num_classes < 2:
        return codes
    distances = pairwise_hamming(codes)
    np.fill_diagonal(distances, np.iinfo(np.int32).max // 2)
    minimum, at_min = _objective(distances)
    for _ in range(max_moves):
        involved = np.unique(np.nonzero(distances == minimum)[0])
        improved = False
        for i in rng.permutation(involved):
            differs = codes != codes[i]  # (C, K): flipping bit b of code i changes d_ij by 1 - 2 differs
            candidate = distances[i][:, None] + 1 - 2 * differs.astype(np.int32)
            candidate[i] = np.iinfo(np.int32).max // 2
            row_min = candidate.min(axis=0)
            row_count = (candidate == minimum).sum(axis=0)
            current = int((distances[i] == minimum).sum())
            feasible = row_min >= minimum
            if not feasible.any():
                continue
            gain = np.where(feasible, current - row_count, -1)
            bit = int(np.argmax(gain))
            if gain[bit] <= 0:
                continue
            codes[i, bit] = -codes[i, bit]
            new_row = candidate[:, bit]
            distances[i], distances[:, i] = new_row, new_row
            distances[i, i] = np.iinfo(np.int32).max // 2
            at_min -= int(gain[bit])
            if at_min == 0:
                minimum, at_min = _objective(distances)
            improved = True
            break
        if not improved:
            break
    return codes


def hadamard_codes(num_classes: int, bits: int) -> np.ndarray | None:
    """Sylvester-Hadamard rows (and their negations when C > K), as CSQ builds its centres; None
    when K is not a power of two or C > 2K. Minimum distance K/2."""
    if bits & (bits - 1) or num_classes > 2 * bits:
        return None
    hadamard = np.ones((1, 1), dtype=np.int8)
    while hadamard.shape[0] < bits:
        hadamard = np.block([[hadamard, hadamard], [hadamard, -hadamard]])
    rows = np.concatenate([hadamard, -hadamard])
    return rows[:num_classes].astype(np.int8)


#: Largest 2^K * C for which :func:`lexicode` scans every K-bit word.
_LEXICODE_WORK = 2**26


def lexicode(num_classes: int, bits: int) -> np.ndarray | None:
    """The greedy lexicographic code with the largest minimum distance d that still has at least
    C words: scan all 2^K words in order, keeping a word when it lies at distance >= d from every
    word kept (lexicodes include the extended Hamming and Golay codes). Only for short codes
    (2^K * C <= 2^26); None otherwise."""
    if bits > 24 or (2**bits) * num_classes > _LEXICODE_WORK:
        return None
    words = np.arange(2**bits, dtype=np.uint32)
    table = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)

    def popcount(values: np.ndarray) -> np.ndarray:
        as_bytes = values.view(np.uint8).reshape(-1, 4)
        return table[as_bytes].sum(axis=1)

    for distance in range(bits, 0, -1):
        allowed = np.ones(words.size, dtype=bool)
        kept = []
        while len(kept) < num_classes and allowed.any():
            word = int(np.argmax(allowed))
            kept.append(word)
            allowed &= popcount(words ^ np.uint32(word)) >= distance
        if len(kept) >= num_classes:
            bits_of = (np.array(kept, dtype=np.uint64)[:, None] >> np.arange(bits - 1, -1, -1, dtype=np.uint64)) & 1
            return np.where(bits_of == 1, 1, -1).astype(np.int8)
    return None


def _better(a: dict, b: dict | None) -> bool:
    return b is None or (a["min_distance"], -a["pairs_at_min"]) > (b["min_distance"], -b["pairs_at_min"])


def hclm_proxies(num_classes: int, bits: int, similarity: np.ndarray | None = None, seed: int = 0,
                 restarts: int = 3, tammes_steps: int = 150) -> np.ndarray:  # fmt: skip
    """C x K ``int8`` +-1 proxies: Tammes + ITQ + sign, improved by restarts, a Hadamard start
    (when it applies) and the bit-flip local search; with ``similarity`` (C x C), the class/proxy
    assignment is permuted by greedy best swaps (sHCLM, HCLM Eq. 18).

    The construction, one small NumPy function a step:

    1. :func:`tammes_points`: C points on the sphere of radius sqrt(K) that (approximately)
       maximise the minimum pairwise distance (the Tammes problem).
    2. :func:`itq_rotation`: the rotation that makes them as binary as possible.
    3. sign.
    4. :func:`improve_min_distance` (not in the paper; docs/design.md s.4): a bit-flip local
       search on the signed codes that raises the minimum Hamming distance, and then lowers the
       number of pairs at it.

    This runs from several starts (Tammes restarts, and the Hadamard rows when K is a power of two
    and C <= 2K, and a greedy lexicode for short codes) and keeps the code with the best (minimum
    distance, fewest pairs at the minimum).

    Raises:
        ValueError: non-positive sizes or a similarity of the wrong shape.
    """
    if num_classes < 1 or bits < 1:
        raise ValueError("num_classes and bits must be positive")
    rng = np.random.default_rng(seed)
    starts = []
    for _ in range(max(1, restarts)):
        points = tammes_points(num_classes, bits, rng, tammes_steps)
        projected = points @ itq_rotation(points, rng)
        starts.append(np.where(projected >= 0, 1, -1).astype(np.int8))
    for structured in (hadamard_codes(num_classes, bits), lexicode(num_classes, bits)):
        if structured is not None:
            starts.append(structured)
    best, best_quality = None, None
    for start in starts:
        codes = improve_min_distance(start, rng)
        quality = code_quality(codes)
        if _better(quality, best_quality):
            best, best_quality = codes, quality
    logger.info("hclm_proxies(C=%d, K=%d): %s", num_classes, bits, best_quality)
    if similarity is not None:
        best = best[assign_proxies(best, similarity)]
    return best


def assignment_cost(codes: np.ndarray, similarity: np.ndarray) -> float:
    """sum_{i != j} s_ij (1 - w_i.w_j / K) of proxies ``codes`` assigned in row order (HCLM Eq. 18)."""
    gram = codes.astype(np.float64) @ codes.T.astype(np.float64)
    weights = np.asarray(similarity, dtype=np.float64).copy()
    np.fill_diagonal(weights, 0.0)
    return float(np.sum(weights * (1.0 - gram / codes.shape[1])))


def assign_proxies(codes: np.ndarray, similarity: np.ndarray, max_swaps: int | None = None) -> np.ndarray:
    """Greedy best swaps (HCLM Eq. 18): a permutation ``p`` such that class c gets proxy
    ``codes[p[c]]``, lowering :func:`assignment_cost` one best transposition at a time until none
    lowers it.

    The change of swapping classes a and b, with G the Gram matrix of the assigned proxies, S the
    similarity (zero diagonal) and A = S G, is -(2/K) [A_ab + A_ba - A_aa - A_bb - 2 s_ab (K - G_ab)].
    """
    similarity = np.asarray(similarity, dtype=np.float64)
    num_classes, bits = codes.shape
    if similarity.shape != (num_classes, num_classes):
        raise ValueError(f"similarity must be ({num_classes}, {num_classes}), got {similarity.shape}")
    if not np.all(np.isfinite(similarity)):
        raise ValueError("similarity contains NaN or infinity")
    weights = (similarity + similarity.T) / 2.0
    np.fill_diagonal(weights, 0.0)
    perm = np.arange(num_classes)
    base_gram = codes.astype(np.float64) @ codes.T.astype(np.float64)
    for _ in range(max_swaps or 10 * num_classes):
        gram = base_gram[np.ix_(perm, perm)]
        a_mat = weights @ gram
        diagonal = np.diag(a_mat)
        delta = -(2.0 / bits) * (a_mat + a_mat.T - diagonal[:, None] - diagonal[None, :] - 2.0 * weights * (bits - gram))
        np.fill_diagonal(delta, 0.0)
        a, b = np.unravel_index(np.argmin(delta), delta.shape)
        if delta[a, b] >= -1e-9:
            break
        perm[[a, b]] = perm[[b, a]]
    return perm


def class_mean_similarity(features: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """HCLM Eq. 19-20: s_ij = exp(-||u_i - u_j||^2 / (2 kappa^2)) over class-mean features u_c,
    kappa the mean distance between class means. ``labels``: class ids or multi-hot."""
    features = np.asarray(features, dtype=np.float64)
    tags = multi_hot(labels, dtype=np.float64)
    counts = tags.sum(axis=0)
    if np.any(counts == 0):
        raise ValueError("every class needs at least one example to define its mean feature")
    means = (tags.T @ features) / counts[:, None]
    squared = ((means[:, None, :] - means[None, :, :]) ** 2).sum(-1)
    kappa = np.sqrt(squared)[np.triu_indices(len(means), 1)].mean()
    return np.exp(-squared / (2.0 * kappa**2))


def tag_cooccurrence_similarity(tags: np.ndarray) -> np.ndarray:
    """HCLM Eq. 21: s_ij = 2 sum_n t_ni t_nj / (sum_n t_ni + sum_n t_nj) from ``(n, C)`` tags."""
    tags = (np.asarray(tags) > 0).astype(np.float64)
    return cooccurrence_similarity(tags.T @ tags)


def cooccurrence_similarity(cooccurrence: np.ndarray) -> np.ndarray:
    """HCLM Eq. 21 from the ``(C, C)`` co-occurrence counts sum_n t_ni t_nj (diagonal: the tag
    counts), as the pipeline's Transform computes them."""
    cooccurrence = np.asarray(cooccurrence, dtype=np.float64)
    counts = np.diag(cooccurrence)
    denominator = counts[:, None] + counts[None, :]
    return np.divide(2.0 * cooccurrence, denominator, out=np.zeros_like(denominator), where=denominator > 0)
