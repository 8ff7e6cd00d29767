"""The CIFAR-10 trunk-cache benchmark's own pieces: the views encoded at test time, codes summed
over views and models (an ensemble), and the distillation's term, centres and build
(``python -m benchmarks.trunk_cache --test-shift / --distil``)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from benchmarks.trunk_cache import (
    CopyCentres,
    averaged_codes,
    distilled,
    encoded_views,
    keeping_first,
    paired_designs,
    parse_args,
    protocol_scores,
    shifted,
)
from tfhash.codes import sign_codes
from tfhash.data.splits import Split
from tfhash.metrics import evaluate_retrieval
from tfhash.models import build_scdh
from tfhash.models.backbones import mlp


def test_a_shift_moves_the_stored_pixels_and_reflects_the_border():
    images = np.arange(2 * 5 * 6 * 3, dtype=np.float32).reshape(2, 5, 6, 3)
    np.testing.assert_array_equal(shifted(images, 0, 0), images)
    up = shifted(images, 1, 0)  # output row i is input row i + 1
    np.testing.assert_array_equal(up[:, :-1], images[:, 1:])
    np.testing.assert_array_equal(up[:, -1], images[:, -2])  # reflected without the edge, not wrapped or zero
    left = shifted(images, 0, -2)
    np.testing.assert_array_equal(left[:, :, 2:], images[:, :, :-2])
    np.testing.assert_array_equal(left[:, :, 0], images[:, :, 2])
    assert shifted(images, 2, -1).shape == images.shape


def test_the_test_views_are_each_image_and_its_mirror_then_four_shifts_of_both():
    images = np.random.default_rng(0).random((3, 8, 8, 3)).astype(np.float32)
    plain = encoded_views(images, 0)
    assert len(plain) == 2
    np.testing.assert_array_equal(plain[0], images)
    np.testing.assert_array_equal(plain[1], images[:, :, ::-1])
    views = encoded_views(images, 1)
    assert len(views) == 10
    np.testing.assert_array_equal(views[2], shifted(images, -1, -1))
    np.testing.assert_array_equal(views[3], shifted(images, -1, -1)[:, :, ::-1])


def teacher_and_student(seed: int):
    """Two small SCDH models of different initial weights, a batch, and the student's own loss
    and its codes' per-bit mean squared difference to the teacher's on that batch."""
    x = np.random.default_rng(seed).normal(size=(16, 6)).astype(np.float32)
    labels = keras.utils.to_categorical(np.arange(16) % 3, 3)
    keras.utils.set_random_seed(0)
    teacher = build_scdh(mlp(6, (8,), dropout=0.0), 3, 8)
    keras.utils.set_random_seed(1)
    student = build_scdh(mlp(6, (8,), dropout=0.0), 3, 8)
    y_pred = student(x)
    own = float(student.compute_loss(x=x, y=labels, y_pred=y_pred))
    gap = float(np.mean((np.asarray(y_pred["codes"]) - np.asarray(teacher(x)["codes"])) ** 2))
    assert gap > 0
    return x, labels, y_pred, teacher, student, own, gap


def test_distillation_adds_its_weight_times_the_codes_squared_distance_to_the_teachers():
    x, labels, y_pred, teacher, student, own, gap = teacher_and_student(1)
    distilled(student, teacher, 2.5)
    np.testing.assert_allclose(float(student.compute_loss(x=x, y=labels, y_pred=y_pred)), own + 2.5 * gap, rtol=1e-5)
    assert distilled(student, student, 0.0) is student  # weight 0: nothing more added
    np.testing.assert_allclose(float(student.compute_loss(x=x, y=labels, y_pred=y_pred)), own + 2.5 * gap, rtol=1e-5)


def test_codes_over_views_and_models_sum_every_continuous_code_before_the_sign():
    x, _, _, teacher, student, _, _ = teacher_and_student(2)
    mirror = x[:, ::-1]
    np.testing.assert_array_equal(averaged_codes([student.continuous_codes(x)]), sign_codes(student.continuous_codes(x)))
    continuous = [np.asarray(m.continuous_codes(v)) for v in (x, mirror) for m in (student, teacher)]
    pair = averaged_codes(continuous)
    np.testing.assert_array_equal(pair, sign_codes(sum(continuous)))
    assert not np.array_equal(pair, averaged_codes(continuous[::2]))  # the partner's codes count


class CountingEncoder:
    """Continuous codes of small pictures (their pixels through a small SCDH model), counting the
    pictures encoded."""

    def __init__(self):
        keras.utils.set_random_seed(0)
        self.model, self.images = build_scdh(mlp(4 * 4 * 3, (8,), dropout=0.0), 3, 8), 0

    def continuous_codes(self, x):
        self.images += len(x)
        return self.model.continuous_codes(np.reshape(x, (len(x), -1)))


@pytest.mark.parametrize("shift", [0, 1])
def test_the_test_protocol_scores_plain_mirrored_and_shifted_codes_encoding_every_view_once(shift):
    images = np.random.default_rng(0).normal(size=(30, 4, 4, 3)).astype(np.float32)
    labels = np.arange(30) % 3
    split = Split(query=np.arange(6), database=np.arange(6, 30), train=np.arange(6, 30), seed=0, protocol="test")
    counting = CountingEncoder()
    fields = protocol_scores(counting, images, labels, split, shift)
    assert counting.images == 30 * (10 if shift else 2)  # every view of every image once
    codes = lambda rows, views: averaged_codes([counting.continuous_codes(v) for v in encoded_views(images[rows], shift)[:views]])  # noqa: E731
    assert not np.array_equal(codes(split.database, 1), codes(split.database, 2))  # the mirrors change codes here
    expect = lambda views: evaluate_retrieval(codes(split.query, views), codes(split.database, views), labels[:6], labels[6:])  # noqa: E731
    assert fields["mAP@all"] == pytest.approx(expect(1).mean_average_precision())
    assert fields["P@H<=2"] == pytest.approx(float(expect(1).precision_at_radius(2)))
    assert fields["mAP@all mirrored"] == pytest.approx(expect(2).mean_average_precision())
    assert fields["P@H<=2 mirrored"] == pytest.approx(float(expect(2).precision_at_radius(2)))
    assert ("mAP@all mirrored and shifted" in fields) == bool(shift)
    if shift:
        assert fields["mAP@all mirrored and shifted"] == pytest.approx(expect(10).mean_average_precision())
    assert fields["encode + score seconds"] >= 0


def test_the_second_model_starts_from_the_teachers_centres_and_only_the_cached_build_is_kept():
    _, _, _, teacher, student, _, _ = teacher_and_student(3)
    assert not np.allclose(student.clusters.get_weights()[0], teacher.clusters.get_weights()[0])
    copy = CopyCentres(teacher)
    copy.set_model(student)
    copy.on_train_begin()
    np.testing.assert_array_equal(student.clusters.get_weights()[0], teacher.clusters.get_weights()[0])
    kept, wrapped = [], []
    build = keeping_first(kept, lambda top: ("model", top), lambda model: wrapped.append(model) or ("wrapped", model))
    assert build("cached") == ("wrapped", ("model", "cached"))
    assert build("full") == ("model", "full")  # the second build (the full model) is neither kept nor wrapped
    assert kept == wrapped == [("model", "cached")]


def test_fit_trains_on_the_distilled_loss():
    """Keras's train step calls the patched ``compute_loss``: one step at learning rate 0 logs
    the student's own loss plus the term."""
    x, labels, _, teacher, student, own, gap = teacher_and_student(2)
    distilled(student, teacher, 3.0).compile(optimizer=keras.optimizers.SGD(0.0))
    logged = student.fit(x, labels, batch_size=16, epochs=1, verbose=0, shuffle=False).history["loss"][0]
    np.testing.assert_allclose(logged, own + 3.0 * gap, rtol=1e-4)


@pytest.mark.parametrize(
    "flags, names",
    [
        (["--test-shift", "-1"], "--test-shift -1"),
        (["--test-shift", "17"], "--test-shift 17"),
        (["--distil", "nan"], "--distil nan"),
        (["--distil", "-0.5"], "--distil -0.5"),
        (["--student-seed", "3"], "needs --distil"),
        (["--distil", "1", "--method", "HyP2"], "HyP2's learned proxies"),
        (["--distil", "0", "--timing"], "--timing measures"),
    ],
)
def test_designs_the_run_cannot_honour_are_refused_before_anything_loads(flags, names, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(flags)
    assert stop.value.code == 2
    assert names in capsys.readouterr().err
    args = parse_args(["--test-shift", "2", "--distil", "0", "--student-seed", "0", "--method", "HCLM"])
    assert (args.test_shift, args.distil, args.student_seed) == (2, 0.0, 0)


def test_the_tables_show_a_rows_paired_designs_in_its_own_protocol():
    assert paired_designs({"mode": "validation", "curve mAP@all with flips": 0.85}) == ""
    validation = {"mode": "validation", "test shift": 2, "curve mAP@all with flips and shifts": 0.84071,
                  "curve mAP@all with flips, with the teacher's codes": 0.855, "teacher": {"curve mAP@all with flips": 0.8507, "mAP@all mirrored": 0.1}}
    assert paired_designs(validation) == "teacher 0.8507; 2-px shifts 0.8407; ensemble 0.8550"
    test = {**validation, "mode": "test", "mAP@all mirrored and shifted": 0.83, "teacher": {"curve mAP@all with flips": 0.2, "mAP@all mirrored": 0.8406}}
    assert paired_designs(test) == "teacher 0.8406; 2-px shifts 0.8300; ensemble (on the curve) 0.8550"
