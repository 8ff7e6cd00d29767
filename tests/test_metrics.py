"""Retrieval metrics against an independent brute-force implementation written here: plain Python
loops over a full sort with the conventions of docs/design.md s.3."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tfhash import codes as tc
from tfhash import metrics


def _random_problem(rng, n_query, n_db, bits, classes, multi_label=False, empty_rows=False):
    query = rng.choice([-1, 1], size=(n_query, bits)).astype(np.int8)
    db = rng.choice([-1, 1], size=(n_db, bits)).astype(np.int8)
    if multi_label:
        q_lab = (rng.random((n_query, classes)) < 0.3).astype(np.uint8)
        d_lab = (rng.random((n_db, classes)) < 0.3).astype(np.uint8)
        if empty_rows:
            q_lab[0] = 0
            d_lab[:3] = 0
    else:
        q_lab = rng.integers(0, classes, n_query)
        d_lab = rng.integers(0, classes, n_db)
    return query, db, q_lab, d_lab


def _relevant(a, b) -> bool:
    if np.ndim(a) == 0:
        return bool(a == b)
    return bool(np.any((np.asarray(a) > 0) & (np.asarray(b) > 0)))


def _distances(q, db):
    bits = q.shape[0]
    return [(bits - int(np.dot(q.astype(int), row.astype(int)))) // 2 for row in db]


def _ref_ap(q, db, q_lab, d_lab, top_r=None):
    dist = _distances(q, db)
    order = sorted(range(len(db)), key=lambda j: (dist[j], j))
    depth = len(db) if top_r is None else top_r
    hits, total = 0, 0.0
    for rank, j in enumerate(order[:depth], start=1):
        if _relevant(q_lab, d_lab[j]):
            hits += 1
            total += hits / rank
    return total / hits if hits else 0.0


def _ref_ap_of_order(rels):
    hits, total = 0, 0.0
    for rank, rel in enumerate(rels, start=1):
        if rel:
            hits += 1
            total += hits / rank
    return total / hits if hits else 0.0


def _ref_tie_aware_ap(q, db, q_lab, d_lab):
    """Average AP over every ordering inside each tie group (exhaustive; tiny databases)."""
    dist = _distances(q, db)
    groups = [[j for j in range(len(db)) if dist[j] == d] for d in sorted(set(dist))]
    rel = [_relevant(q_lab, d_lab[j]) for j in range(len(db))]
    aps = []
    for perms in itertools.product(*[itertools.permutations(g) for g in groups]):
        order = [j for group in perms for j in group]
        aps.append(_ref_ap_of_order([rel[j] for j in order]))
    return float(np.mean(aps))


def _ref_radius(q, db, q_lab, d_lab, radius):
    dist = _distances(q, db)
    ball = [j for j in range(len(db)) if dist[j] <= radius]
    hits = sum(_relevant(q_lab, d_lab[j]) for j in ball)
    total_rel = sum(_relevant(q_lab, d_lab[j]) for j in range(len(db)))
    precision = hits / len(ball) if ball else 0.0
    recall = hits / total_rel if total_rel else 0.0
    return precision, recall, len(ball)


def _ref_p_at_n(q, db, q_lab, d_lab, n):
    dist = _distances(q, db)
    order = sorted(range(len(db)), key=lambda j: (dist[j], j))
    return sum(_relevant(q_lab, d_lab[j]) for j in order[:n]) / n


@pytest.mark.parametrize("multi_label", [False, True])
@pytest.mark.parametrize("top_r", [None, 3, 20, 150])
def test_map_matches_brute_force(multi_label, top_r):
    rng = np.random.default_rng(1)
    # 8 bits over 200 items: many ties at every distance.
    q, db, ql, dl = _random_problem(rng, 25, 200, 8, 5, multi_label, empty_rows=multi_label)
    expected = [_ref_ap(q[i], db, ql[i], dl, top_r) for i in range(len(q))]
    got = metrics.average_precision(q, db, ql, dl, top_r=top_r)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    assert metrics.mean_average_precision(q, db, ql, dl, top_r=top_r) == pytest.approx(np.mean(expected))


@pytest.mark.parametrize("multi_label", [False, True])
@pytest.mark.parametrize("top_r", [None, 7, 150])
def test_sharded_evaluation_equals_the_whole_database(multi_label, top_r):
    """Shards in the database's order (uneven, some empty, packed or +-1 codes) give the in-memory
    numbers exactly: AP in the stable tie order (8 bits over 300 items: ties everywhere, and
    the shard boundaries cut through them), P@N, the radius curves and the tie-aware AP."""
    rng = np.random.default_rng(7)
    q, db, ql, dl = _random_problem(rng, 30, 300, 8, 5, multi_label, empty_rows=multi_label)
    whole = metrics.evaluate_retrieval(q, db, ql, dl, top_r=top_r, precision_at=[1, 10, 299], tie_aware=top_r is None)
    for cuts in ([0, 300], [0, 1, 2, 150, 150, 299, 300], [0, 37, 101, 102, 230, 300]):
        parts = [(tc.pack_codes(db[a:b]) if i % 2 else db[a:b], dl[a:b]) for i, (a, b) in enumerate(itertools.pairwise(cuts))]
        sharded = metrics.evaluate_retrieval_sharded(q, ql, lambda parts=parts: iter(parts), top_r=top_r, precision_at=[1, 10, 299],
                                                     tie_aware=top_r is None)  # fmt: skip
        assert sharded.num_database == 300
        np.testing.assert_array_equal(sharded.average_precision, whole.average_precision)
        for name in ("precision_by_radius", "recall_by_radius", "ball_size_by_radius", "tie_aware_average_precision"):
            np.testing.assert_array_equal(getattr(sharded, name), getattr(whole, name))
        for n in (1, 10, 299):
            np.testing.assert_array_equal(sharded.precision_at[n], whole.precision_at[n])
    assert not np.array_equal(  # the order matters: reversed shards tie-break otherwise
        metrics.evaluate_retrieval_sharded(q, ql, lambda: iter([(db[150:], dl[150:]), (db[:150], dl[:150])])).average_precision,
        metrics.evaluate_retrieval(q, db, ql, dl).average_precision)  # fmt: skip


def test_sharded_evaluation_refuses_what_it_cannot_merge():
    rng = np.random.default_rng(0)
    q, db, ql, dl = _random_problem(rng, 4, 40, 16, 3)
    with pytest.raises(ValueError, match="every shard is empty"):
        metrics.evaluate_retrieval_sharded(q, ql, lambda: iter([(db[:0], dl[:0])]))
    with pytest.raises(ValueError, match="top_r = 41 must lie in 1..40"):
        metrics.evaluate_retrieval_sharded(q, ql, lambda: iter([(db[:20], dl[:20]), (db[20:], dl[20:])]), top_r=41)
    with pytest.raises(ValueError, match="query codes have 16 bits, database codes 8"):
        metrics.evaluate_retrieval_sharded(q, ql, lambda: iter([(db[:20], dl[:20]), (db[20:, :8], dl[20:])]))
    passes = iter([[(db[:20], dl[:20]), (db[20:], dl[20:])], [(db[:25], dl[:25]), (db[25:], dl[25:])]])
    with pytest.raises(ValueError, match="shard 0 differs between the two passes"):
        metrics.evaluate_retrieval_sharded(q, ql, lambda: iter(next(passes)))
    passes = iter([[(db[:20], dl[:20]), (db[20:], dl[20:])], [(db[:20], dl[:20])]])
    with pytest.raises(ValueError, match="the second pass over the shards yielded 1 shards, the first 2"):
        metrics.evaluate_retrieval_sharded(q, ql, lambda: iter(next(passes)))


def test_top_r_below_and_above_number_of_relevant():
    # One query, relevant items at known ranks.
    q = np.ones((1, 8), dtype=np.int8)
    db = np.ones((6, 8), dtype=np.int8)
    for j in range(6):
        db[j, :j] = -1  # distance j
    dl = np.array([0, 1, 0, 0, 1, 1])
    ql = np.array([0])
    # relevant at ranks 1, 3, 4 -> AP@all = (1 + 2/3 + 3/4) / 3
    assert metrics.mean_average_precision(q, db, ql, dl) == pytest.approx((1 + 2 / 3 + 3 / 4) / 3)
    # R = 2 (fewer than the 3 relevant): only rank 1 is a hit -> AP = 1
    assert metrics.mean_average_precision(q, db, ql, dl, top_r=2) == pytest.approx(1.0)
    # R = 3: ranks 1, 3 -> (1 + 2/3) / 2
    assert metrics.mean_average_precision(q, db, ql, dl, top_r=3) == pytest.approx((1 + 2 / 3) / 2)


def test_query_without_relevant_items_counts_as_zero():
    rng = np.random.default_rng(2)
    q, db, _, _ = _random_problem(rng, 2, 30, 16, 3)
    ql = np.array([[1, 0, 0], [0, 0, 0]], dtype=np.uint8)  # second query has no label
    dl = np.zeros((30, 3), dtype=np.uint8)
    dl[:, 0] = 1
    dl[5, 1] = 1
    ap = metrics.average_precision(q, db, ql, dl)
    assert ap[1] == 0.0 and ap[0] == pytest.approx(1.0)
    assert metrics.mean_average_precision(q, db, ql, dl) == pytest.approx(0.5)


@pytest.mark.parametrize("multi_label", [False, True])
def test_radius_metrics_match_brute_force(multi_label):
    rng = np.random.default_rng(3)
    q, db, ql, dl = _random_problem(rng, 30, 120, 16, 4, multi_label)
    report = metrics.evaluate_retrieval(q, db, ql, dl)
    for radius in (0, 1, 2, 5, 16):
        refs = [_ref_radius(q[i], db, ql[i], dl, radius) for i in range(len(q))]
        np.testing.assert_allclose(report.precision_by_radius[:, radius], [r[0] for r in refs], atol=1e-12)
        np.testing.assert_allclose(report.recall_by_radius[:, radius], [r[1] for r in refs], atol=1e-12)
        np.testing.assert_array_equal(report.ball_size_by_radius[:, radius], [r[2] for r in refs])
        # radius 0 at 16 bits: most balls are empty and score 0
        assert metrics.precision_at_hamming_radius(q, db, ql, dl, radius=radius) == pytest.approx(
            np.mean([r[0] for r in refs])
        )
    assert report.nonempty_ball_share(0) < 1.0  # the test really has empty balls


def test_precision_at_n_and_curve_match_brute_force():
    rng = np.random.default_rng(4)
    q, db, ql, dl = _random_problem(rng, 20, 90, 8, 3, multi_label=True)
    for n in (1, 7, 90):
        expected = np.mean([_ref_p_at_n(q[i], db, ql[i], dl, n) for i in range(len(q))])
        assert metrics.precision_at_n(q, db, ql, dl, n) == pytest.approx(expected)
    curve = metrics.precision_at_n_curve(q, db, ql, dl, [10, 5])
    assert list(curve["n"]) == [5, 10]
    assert curve["precision"][0] == pytest.approx(np.mean([_ref_p_at_n(q[i], db, ql[i], dl, 5) for i in range(20)]))


@pytest.mark.parametrize("multi_label", [False, True])
def test_tie_aware_map_matches_exhaustive_expectation(multi_label):
    rng = np.random.default_rng(5)
    q, db, ql, dl = _random_problem(rng, 6, 7, 8, 3, multi_label)
    # Force large tie groups: few distinct codes in the database.
    db = db[rng.integers(0, 3, 7)]
    expected = np.mean([_ref_tie_aware_ap(q[i], db, ql[i], dl) for i in range(len(q))])
    assert metrics.mean_average_precision_tie_aware(q, db, ql, dl) == pytest.approx(expected, abs=1e-12)


def test_tie_aware_is_immune_to_class_sorted_database():
    """docs/design.md s.3: collapsed codes on a class-sorted database flatter the stable-order mAP."""
    labels = np.repeat(np.arange(10), 50)
    db = np.ones((500, 16), dtype=np.int8)
    q = np.ones((10, 16), dtype=np.int8)
    ql = np.zeros(10, dtype=np.int64)  # queries of class 0: class 0 sits first in the database
    stable = metrics.mean_average_precision(q, db, ql, labels)
    tie_aware = metrics.mean_average_precision_tie_aware(q, db, ql, labels)
    assert stable == pytest.approx(1.0)
    # Expected AP of a random order with 50 relevant in 500 is close to the base rate 0.1.
    assert tie_aware == pytest.approx(0.1, abs=0.02)


def test_packed_codes_and_label_forms_agree():
    rng = np.random.default_rng(6)
    q, db, ql, dl = _random_problem(rng, 15, 80, 24, 4)
    base = metrics.mean_average_precision(q, db, ql, dl)
    assert metrics.mean_average_precision(tc.pack_codes(q), tc.pack_codes(db), ql, dl) == base
    one_hot_q = np.eye(4, dtype=np.uint8)[ql]
    one_hot_d = np.eye(4, dtype=np.float32)[dl]
    assert metrics.mean_average_precision(q, db, one_hot_q, one_hot_d) == base
    assert metrics.mean_average_precision(q, db, ql, one_hot_d) == base


def test_thread_count_does_not_change_results():
    import numba

    rng = np.random.default_rng(7)
    q, db, ql, dl = _random_problem(rng, 41, 300, 32, 5, multi_label=True)
    full = metrics.evaluate_retrieval(q, db, ql, dl, tie_aware=True, precision_at=[10])
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        single = metrics.evaluate_retrieval(q, db, ql, dl, tie_aware=True, precision_at=[10])
    finally:
        numba.set_num_threads(previous)
    np.testing.assert_array_equal(full.average_precision, single.average_precision)
    np.testing.assert_array_equal(full.tie_aware_average_precision, single.tie_aware_average_precision)
    np.testing.assert_array_equal(full.precision_by_radius, single.precision_by_radius)
    np.testing.assert_array_equal(full.precision_at[10], single.precision_at[10])


def test_byte_words_and_many_classes_match_brute_force():
    """K = 24 runs on 8-bit words; 70 classes need two 64-bit label words."""
    rng = np.random.default_rng(12)
    q, db, ql, dl = _random_problem(rng, 12, 150, 24, 70, multi_label=True)
    expected = [_ref_ap(q[i], db, ql[i], dl) for i in range(len(q))]
    np.testing.assert_allclose(metrics.average_precision(q, db, ql, dl), expected, rtol=0, atol=1e-12)
    ids_q, ids_db = rng.integers(0, 70, 12), rng.integers(0, 70, 150)
    expected = [_ref_ap(q[i], db, ids_q[i], ids_db) for i in range(len(q))]
    np.testing.assert_allclose(metrics.average_precision(q, db, ids_q, ids_db), expected, rtol=0, atol=1e-12)


def test_hamming_distance_definition():
    rng = np.random.default_rng(8)
    for bits in (8, 24, 64, 128):
        a = rng.choice([-1, 1], size=(5, bits)).astype(np.int8)
        b = rng.choice([-1, 1], size=(9, bits)).astype(np.int8)
        expected = (bits - a.astype(int) @ b.astype(int).T) // 2
        np.testing.assert_array_equal(tc.hamming_distances(tc.pack_codes(a), tc.pack_codes(b)), expected)


def test_sign_and_pack_conventions():
    values = np.array([[0.0, -0.1, 2.0, -3.0, 0.0, 1.0, -1.0, 5.0]])
    signs = tc.sign_codes(values)
    assert signs.tolist() == [[1, -1, 1, -1, 1, 1, -1, 1]]  # sign(0) = +1
    assert tc.pack_codes(signs).tolist() == [[0b10101101]]  # big bit order
    np.testing.assert_array_equal(tc.unpack_codes(tc.pack_codes(signs)), signs)
    with pytest.raises(ValueError, match="NaN"):
        tc.sign_codes(np.array([[np.nan, 1.0]]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"top_r": 0}, "top_r"),
        ({"top_r": 1000}, "database size"),
        ({"precision_at": [0]}, "precision_at"),
        ({"tie_aware": True, "top_r": 5}, "whole ranking"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, message):
    rng = np.random.default_rng(9)
    q, db, ql, dl = _random_problem(rng, 3, 20, 8, 2)
    with pytest.raises(ValueError, match=message):
        metrics.evaluate_retrieval(q, db, ql, dl, **kwargs)


def test_bad_inputs_are_clear_errors():
    rng = np.random.default_rng(10)
    q, db, ql, dl = _random_problem(rng, 3, 20, 8, 2)
    with pytest.raises(ValueError, match="bits"):
        metrics.mean_average_precision(q, np.ones((20, 16), np.int8), ql, dl)
    with pytest.raises(ValueError, match="label rows"):
        metrics.mean_average_precision(q, db, ql[:2], dl)
    with pytest.raises(ValueError, match="empty"):
        metrics.mean_average_precision(q, db[:0], ql, dl[:0])
    with pytest.raises(ValueError, match="sign_codes"):
        metrics.mean_average_precision(q * 0.5, db, ql, dl)
    with pytest.raises(ValueError, match="NaN"):
        metrics.mean_average_precision(q, db, np.full((3, 2), np.nan), np.ones((20, 2)))
    with pytest.raises(ValueError, match="classes"):
        metrics.mean_average_precision(q, db, np.ones((3, 2)), np.ones((20, 3)))


def test_cross_modal_reports_both_directions():
    rng = np.random.default_rng(11)
    img_q, img_db, ql, dl = _random_problem(rng, 10, 40, 16, 3)
    txt_q, txt_db, _, _ = _random_problem(rng, 10, 40, 16, 3)
    out = metrics.cross_modal_mean_average_precision(
        {"image": img_q, "text": txt_q}, {"image": img_db, "text": txt_db}, ql, dl
    )
    assert out["image->text"] == pytest.approx(metrics.mean_average_precision(img_q, txt_db, ql, dl))
    assert out["text->image"] == pytest.approx(metrics.mean_average_precision(txt_q, img_db, ql, dl))


def test_class_distances_against_direct_computation():
    codes = np.array([[0.0, 0.0], [2.0, 0.0], [10.0, 0.0], [10.0, 2.0]])
    labels = np.array([0, 0, 1, 1])
    out = metrics.class_distances(codes, labels)
    # centres (1, 0) and (10, 1); every sample is at distance 1 from its centre
    assert out["d_intra"] == pytest.approx(1.0)
    assert out["d_inter"] == pytest.approx(np.hypot(9.0, 1.0))
