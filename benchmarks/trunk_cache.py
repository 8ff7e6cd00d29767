"""CIFAR-10 through an ImageNet network (``--backbone``: SqueezeNet v1.1, EfficientNet-Lite0/1/2)
fine-tuned above a cached frozen trunk (:mod:`tfhash.trunk_cache`).

Protocol as :mod:`benchmarks.fine_tuning` (1,000 queries, 59,000 database, 5,000 of it train; mAP
over the whole ranking). Three modes:

* ``--validation``: train on 4,000 of the 5,000 training images; every ``--eval-every`` epochs 500
  held-out training images (50 per class) are scored against the other 500. This curve chooses
  the settings (``--recipe``, ``--views``, ``--cut``, ``--precision``) and the epochs; the
  queries are never used.
* test (default): train on all 5,000, report the last epoch on the queries against the database.
* ``--timing``: seconds per epoch on the cache against full fine-tuning at the same side (at
  least 3 measured epochs each, after one warm-up epoch), the cache's build time, disk and the
  process's peak memory.

Two designs are scored paired within a run: ``--test-shift P`` also encodes the curve's images
(and on the test protocol the queries and database, all views in memory at once) over their
mirrors and four diagonal shifts by P stored pixels; ``--distil W`` first trains a teacher with the
same settings, then the reported model from the teacher's cluster centres (SCDH; HCLM's fixed
proxies are shared anyway) with W x the mean over bits of the squared difference of its codes to
the teacher's added to its loss (W = 0: no such term; the second model still starts from the
teacher's centres and sees the same batches), and scores the two models' codes averaged on the
curve (an ensemble of two); the teacher's numbers go in the row.

Results accumulate in ``benchmarks/results/trunk_cache.{json,md}`` (a rerun replaces its row)::

    python -m benchmarks.trunk_cache --validation --bits 48 --epochs 60 --eval-every 10 --seed 0 --label base
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.common import RESULTS_DIR, cpu_description, markdown_table, write_results  # noqa: E402
from benchmarks.fine_tuning import SCDH_TABLE_I_ALEXNET, TimedRetrievalEval  # noqa: E402
from tfhash.codes import sign_codes  # noqa: E402
from tfhash.data import load_cifar10  # noqa: E402
from tfhash.data.splits import validation_split  # noqa: E402
from tfhash.fine_tuning import FineTuning  # noqa: E402
from tfhash.metrics import evaluate_retrieval  # noqa: E402
from tfhash.models import build_hclm, build_hyp2, build_scdh, image_backbone  # noqa: E402
from tfhash.networks import EFFICIENTNET_LITE  # noqa: E402
from tfhash.optimizers import compile_fine_tuning  # noqa: E402
from tfhash.precision import precision_policy  # noqa: E402
from tfhash.trunk_cache import fit_on_cache  # noqa: E402

BATCH = 64
#: The settings of the shipped config (pipelines/configs/cifar10.json), the baseline of --recipe.
BASE = {"backbone_learning_rate": 0.005, "dropout": 0.5}


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def run_policy(precision: str) -> str:
    """The Keras policy of ``--precision``: bfloat16 only where the CPU has it (the library's rule,
    :func:`tfhash.precision.precision_policy`); elsewhere float32 with a warning, never emulated."""
    return precision_policy({"float32": "off", "bfloat16": "bfloat16"}[precision], gpu=bool(tf.config.list_physical_devices("GPU")))


def ran_in(policy: str) -> str:
    """The precision a row records: what the run computed in, not what was asked."""
    return "bfloat16" if policy == "mixed_bfloat16" else "float32"


def make_backbone(backbone: str, size: int, recipe: FineTuning):
    return lambda: image_backbone(backbone, (32, 32, 3), size=size, **recipe.backbone_options())


def build(method: str, bits: int, seed: int, options: dict | None = None, init_seed: int | None = None):
    """backbone -> the method's model, its initial weights drawn from ``init_seed`` (default
    ``seed``; HCLM's proxies always from ``seed``); ``options`` are the builder's settings over its
    defaults (e.g. HCLM's ``triplet_weight``)."""
    options = options or {}

    def model(backbone):
        keras.utils.set_random_seed(seed if init_seed is None else init_seed)
        if method == "SCDH":
            return build_scdh(backbone, 10, bits, **{"preset": "cifar10", **options})
        if method == "HCLM":
            return build_hclm(backbone, 10, bits, **{"seed": seed, **options})
        return build_hyp2(backbone, 10, bits, **options)

    return model


def cached_recipe(args, cache_dir: str) -> FineTuning:
    """The benchmark's recipe: BASE with ``--recipe`` over it, trained on a trunk cache in ``cache_dir``."""
    cache = {"cut": args.cut, "views": args.views, "directory": cache_dir, "mixup": args.mixup}
    return FineTuning.for_backbone(args.backbone, **{**BASE, **args.recipe, "trunk_cache": cache})


def shifted(images: np.ndarray, dy: int, dx: int) -> np.ndarray:
    """``images`` moved by ``dy`` rows and ``dx`` columns of stored pixels (output row i is input
    row i + dy), the borders reflected without repeating the edge pixel (numpy's ``"reflect"``;
    the training views' shift, :data:`tfhash.networks.AUGMENTATIONS`' ``"shift"``, repeats it)."""
    pad = max(abs(dy), abs(dx))
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect")
    return padded[:, pad + dy:pad + dy + images.shape[1], pad + dx:pad + dx + images.shape[2]]


def encoded_views(images: np.ndarray, shift: int) -> list[np.ndarray]:
    """The views encoded at test time: each image and its mirror, and with ``shift`` > 0 the same
    for the four diagonal shifts by ``shift`` stored pixels (10 views)."""
    moved = [images] + [shifted(images, dy, dx) for dy in (-shift, shift) for dx in (-shift, shift)] if shift else [images]
    return [view for m in moved for view in (m, m[:, :, ::-1])]


def averaged_codes(continuous: list[np.ndarray]) -> np.ndarray:
    """The codes of images from several continuous codes of them (each view of them, e.g.
    :func:`encoded_views`, through each model): summed before the sign (one model: encoding over
    the views; two: an ensemble)."""
    return sign_codes(sum(continuous))


def protocol_scores(model, images: np.ndarray, labels: np.ndarray, split, shift: int) -> dict:
    """The test protocol's fields of ``model`` (``split.query`` against ``split.database``):
    mAP@all and P@H<=2 of the plain images' codes, with the seconds to encode and score them;
    the same encoded with mirrors; with ``shift`` > 0, mAP@all encoded over the ten views of
    :func:`encoded_views`. Every view of every image goes through the model once."""
    splits = (split.query, split.database)
    scored = lambda codes, views: evaluate_retrieval(*(averaged_codes(c[:views]) for c in codes),  # noqa: E731
                                                     labels[split.query], labels[split.database])  # fmt: skip
    start = time.perf_counter()
    codes = [[model.continuous_codes(images[rows])] for rows in splits]
    plain = scored(codes, 1)
    fields = {"mAP@all": plain.mean_average_precision(), "P@H<=2": float(plain.precision_at_radius(2)),
              "encode + score seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
    for known, rows in zip(codes, splits, strict=True):
        known.extend(model.continuous_codes(view) for view in encoded_views(images[rows], shift)[1:])  # view 0: the plain images
    mirrored = scored(codes, 2)
    fields.update({"mAP@all mirrored": mirrored.mean_average_precision(), "P@H<=2 mirrored": float(mirrored.precision_at_radius(2))})
    if shift:
        fields["mAP@all mirrored and shifted"] = scored(codes, len(codes[0])).mean_average_precision()
    return fields


def keeping_first(kept: list, make, wrap=lambda model: model):
    """A build for :func:`tfhash.trunk_cache.fit_on_cache` from ``make`` (the cached top -> the
    model) that keeps the first model it builds (the one trained on the cache; the second is the
    full model) in ``kept`` and returns it through ``wrap``."""

    def build_model(top):
        model = make(top)
        if kept:
            return model
        kept.append(model)
        return wrap(model)

    return build_model


def distilled(student, teacher, weight: float):
    """``student`` trained with ``weight`` x the mean (over the batch and the bits) of the squared
    difference of its continuous codes to ``teacher``'s on the same (cached, possibly mixed)
    inputs added to its own loss (a "born-again" distillation); unchanged at weight 0. The codes
    share a frame only if the student starts from the teacher's centres (:class:`CopyCentres`)
    or proxies."""
    if weight == 0:
        return student
    own = student.compute_loss

    def compute_loss(x=None, y=None, y_pred=None, sample_weight=None, training=True):
        target = tf.stop_gradient(tf.cast(teacher(x, training=False)["codes"], tf.float32))
        gap = tf.reduce_mean(tf.square(tf.cast(y_pred["codes"], tf.float32) - target))
        return own(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training) + weight * gap

    student.compute_loss = compute_loss
    return student


class CopyCentres(keras.callbacks.Callback):
    """At the start of training: the model's semantic cluster centres set to the teacher's."""

    def __init__(self, teacher):
        super().__init__()
        self.teacher = teacher

    def on_train_begin(self, logs=None):
        self.model.clusters.set_weights(self.teacher.clusters.get_weights())


def run(args, images, labels, split) -> dict:
    if args.distil is None:
        return train_row(args, images, labels, split, build(args.method, args.bits, args.seed, args.options))
    teachers, students = [], []  # the cached models (fit_on_cache's first build; its second is the full model)
    student_seed = args.seed + 1000 if args.student_seed is None else args.student_seed
    teacher_build = keeping_first(teachers, build(args.method, args.bits, args.seed, args.options))
    student_build = keeping_first(students, build(args.method, args.bits, args.seed, args.options, student_seed),
                                  lambda model: distilled(model, teachers[0], args.distil))
    teacher = train_row(args, images, labels, split, teacher_build)
    student = train_row(args, images, labels, split, student_build,
                        extra_callbacks=[CopyCentres(teachers[0])] if hasattr(teachers[0], "clusters") else [], partner=teachers[0])  # fmt: skip
    teacher_keys = ("curve", "curve mAP@all with flips", "curve mAP@all with flips and shifts", "mAP@all", "mAP@all mirrored",
                    "mAP@all mirrored and shifted", "cache + train seconds")  # fmt: skip
    return {**student, "distil": {"weight": args.distil, "student init seed": student_seed},
            "teacher": {k: teacher[k] for k in teacher_keys if k in teacher},
            "cache + train seconds": round(teacher["cache + train seconds"] + student["cache + train seconds"], 1)}


def train_row(args, images, labels, split, build_model, extra_callbacks=(), partner=None) -> dict:
    """One model trained on the cache as ``args`` say (``build_model``: the cached top -> the
    model), scored: the result row; with a ``partner`` (a model on the same cache, in the same
    code frame) also the two models' codes averaged before the sign (an ensemble of two)."""
    keras.utils.set_random_seed(args.seed)
    cache_dir = args.cache_dir or os.path.join(tempfile.gettempdir(), "tfhash-trunk-cache")
    recipe = cached_recipe(args, cache_dir)
    if args.validation:
        carved = validation_split(split.train, labels, held_out=100, queries=50, seed=args.seed)  # per class
        train, curve_q, curve_db = carved.train, carved.query, carved.database
    else:
        train, curve_q = split.train, split.query
        curve_db = np.random.default_rng(args.seed).choice(split.database, 5000, replace=False)
    x_train, y_train = images[train], labels[train]
    curve = []

    flipped = {}

    class FlipEval(keras.callbacks.Callback):
        """At the end: the curve's mAP@all with each image's codes averaged with its mirror's
        before the sign (encoding with flips), and with ``--test-shift`` over the shifted views too."""

        def __init__(self, activations):
            super().__init__()
            self.activations = activations

        def on_train_end(self, logs=None):
            score = lambda q, db, models: evaluate_retrieval(*(averaged_codes([m.continuous_codes(v) for v in views for m in models]) for views in (q, db)),  # noqa: E731
                                                             labels[curve_q], labels[curve_db]).mean_average_precision()  # fmt: skip
            (q, db) = self.activations
            flipped["mAP@all"] = score(q[:2], db[:2], (self.model,))
            if partner is not None:
                flipped["ensemble"] = score(q[:2], db[:2], (self.model, partner))
            if args.test_shift:
                flipped["shifts"] = score(q, db, (self.model,))

    def callbacks(cut):
        trunk = lambda x: np.asarray(cut.trunk.predict(x, batch_size=256, verbose=0), np.float32)  # noqa: E731
        activations = [[trunk(view) for view in encoded_views(images[rows], args.test_shift)] for rows in (curve_q, curve_db)]
        curve.append(TimedRetrievalEval(activations[0][0], labels[curve_q], activations[1][0], labels[curve_db],
                                        frequency=args.eval_every, prefix="curve_"))  # fmt: skip
        flips = FlipEval(activations)
        if args.ema:
            curve.append(WeightAverages(args.ema, args.eval_every, flips))
        return [*extra_callbacks, *curve, flips]

    class WeightAverages(keras.callbacks.Callback):
        """Exponential moving averages of the trained weights at each of ``momenta``, updated after
        every batch and scored on the curve (and with flips at the end) beside the raw weights of
        the same run: training is untouched, so the comparison is paired."""

        def __init__(self, momenta, frequency, flips):
            super().__init__()
            self.momenta, self.frequency, self.flips, self.seconds = momenta, frequency, flips, 0.0

        def on_train_begin(self, logs=None):
            self.variables = [v.value for v in self.model.trainable_variables]
            self.shadows = {m: [tf.Variable(v.read_value(), trainable=False) for v in self.variables] for m in self.momenta}

            @tf.function
            def update():
                for m, shadows in self.shadows.items():
                    for shadow, v in zip(shadows, self.variables, strict=True):
                        shadow.assign(m * shadow + (1.0 - m) * v)

            self.update = update

        def on_train_batch_end(self, batch, logs=None):
            self.update()

        def swapped(self, momentum, score):
            raw = [v.numpy() for v in self.variables]
            for shadow, v in zip(self.shadows[momentum], self.variables, strict=True):
                v.assign(shadow)
            try:
                return score()
            finally:
                for value, v in zip(raw, self.variables, strict=True):
                    v.assign(value)

        def on_epoch_end(self, epoch, logs=None):
            if logs is None or (epoch + 1) % self.frequency:
                return
            start = time.perf_counter()
            for m in self.momenta:
                logs[f"curve_map_ema{m}"] = self.swapped(m, lambda: evaluate_retrieval(
                    self.model.encode(curve[0].query_x), self.model.encode(curve[0].db_x), labels[curve_q],
                    labels[curve_db]).mean_average_precision())  # fmt: skip
                print(f"  epoch {epoch + 1}: curve mAP@all, weights averaged at {m}: {logs[f'curve_map_ema{m}']:.4f}", flush=True)
            self.seconds += time.perf_counter() - start

        def on_train_end(self, logs=None):
            for m in self.momenta:
                self.swapped(m, lambda: self.flips.on_train_end())
                flipped[f"ema{m}"] = flipped["mAP@all"]

    policy = run_policy(args.precision)
    start = time.perf_counter()
    model, history, cache = fit_on_cache(recipe, build_model, make_backbone(args.backbone, args.size, recipe),
                                                x_train, y_train, epochs=args.epochs, batch_size=BATCH, seed=args.seed,
                                         backbone_name=args.backbone, policy=policy, callbacks=callbacks)  # fmt: skip
    seconds = time.perf_counter() - start - sum(c.seconds for c in curve)
    history = history.history
    points = [{"epoch": args.eval_every * (i + 1), "mAP@all": value, "loss": history["loss"][args.eval_every * (i + 1) - 1],
               **{f"mAP@all ema {m}": history[f"curve_map_ema{m}"][i] for m in args.ema}}
              for i, value in enumerate(history.get("curve_map", []))]  # fmt: skip
    row = {"label": args.label, "backbone": args.backbone, "mode": "validation" if args.validation else "test", "method": args.method, "bits": args.bits, "size": args.size,
           "cut": args.cut, "views": args.views, "mixup": args.mixup, "precision": ran_in(policy), "cpu": cpu_description(), "epochs": args.epochs, "seed": args.seed,
           "train images": int(len(train)), "curve": points, "recipe": {**BASE, **args.recipe}, **({"options": args.options} if args.options else {}),
           "cache + train seconds": round(seconds, 1), "cache GB": round(cache.activations.nbytes / 1e9, 2),
           "curve mAP@all with flips": flipped.get("mAP@all"),
           **({"curve mAP@all with flips and shifts": flipped["shifts"], "test shift": args.test_shift} if args.test_shift else {}),
           **({"curve mAP@all with flips, with the teacher's codes": flipped["ensemble"]} if partner is not None else {}),
           **{f"curve mAP@all with flips, ema {m}": flipped[f"ema{m}"] for m in args.ema}}  # fmt: skip
    if not args.validation:
        row.update(protocol_scores(model, images, labels, split, args.test_shift))
    row["peak RSS GB"] = round(peak_rss_gb(), 2)
    return row


def timing(args, images, labels, split) -> dict:
    """Seconds per epoch: cached against full fine-tuning at ``args.size``, same recipe and batch."""
    cache_dir = tempfile.mkdtemp(prefix="tfhash-trunk-timing-")
    policy = run_policy(args.precision)
    recipe = cached_recipe(args, cache_dir)
    x_train, y_train = images[split.train], labels[split.train]
    measured = args.epochs

    class EpochTimes(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.times.append(time.perf_counter() - self.start)

    try:
        cached_times = EpochTimes()
        start = time.perf_counter()
        _, _, cache = fit_on_cache(recipe, build(args.method, args.bits, args.seed, args.options), make_backbone(args.backbone, args.size, recipe), x_train,
                                          y_train, epochs=measured + 1, batch_size=BATCH, seed=args.seed, backbone_name=args.backbone,
                                   policy=policy, callbacks=[cached_times])  # fmt: skip
        cached_total = time.perf_counter() - start
        build_seconds = cached_total - sum(cached_times.times)
        disk = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(cache_dir) for f in files)
        full_times = EpochTimes()
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = build(args.method, args.bits, args.seed, args.options)(make_backbone(args.backbone, args.size, recipe)())
            compile_fine_tuning(model, recipe, measured + 1, -(-len(y_train) // BATCH))
            model.fit(x_train, y_train, batch_size=BATCH, epochs=measured + 1, verbose=0, callbacks=[full_times])
        finally:
            keras.mixed_precision.set_global_policy("float32")
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    cached_epoch, full_epoch = float(np.median(cached_times.times[1:])), float(np.median(full_times.times[1:]))
    return {"label": args.label, "backbone": args.backbone, "mode": "timing", "method": args.method, "bits": args.bits, "size": args.size, "cut": args.cut, "views": args.views,
            "precision": ran_in(policy), "cpu": cpu_description(), "measured epochs": measured, "seed": args.seed, "train images": int(len(y_train)),
            "cached seconds per epoch": round(cached_epoch, 2), "full seconds per epoch": round(full_epoch, 2),
            "speed-up": round(full_epoch / cached_epoch, 2), "cache build seconds": round(build_seconds, 1),
            "cache disk GB": round(disk / 1e9, 2), "peak RSS GB": round(peak_rss_gb(), 2),
            "cached epochs (s)": [round(t, 2) for t in cached_times.times], "full epochs (s)": [round(t, 2) for t in full_times.times],
            "curve": []}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's settings, checked (``parser.error`` on a value the run cannot honour)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", choices=("squeezenet", *EFFICIENTNET_LITE), default="squeezenet")
    parser.add_argument("--method", choices=("SCDH", "HCLM", "HyP2"), default="SCDH")
    parser.add_argument("--bits", type=int, default=48)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--cut", default="pool5")
    parser.add_argument("--views", type=int, default=8)
    parser.add_argument("--mixup", type=float, default=0.0, help="trunk_cache.mixup: Beta(a, a) mixup of the cached rows (0: off)")
    parser.add_argument("--ema", type=float, nargs="*", default=[],
                        help="also score exponential moving averages of the weights at these momenta (paired with the raw weights)")
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--validation", action="store_true")
    parser.add_argument("--timing", action="store_true", help="--epochs measured epochs each, after one warm-up epoch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipe", type=json.loads, default={}, help="FineTuning settings over BASE, as JSON")
    parser.add_argument("--options", type=json.loads, default={},
                        help="the method's builder settings over its defaults, as JSON (e.g. '{\"triplet_weight\": 2.0}' for HCLM)")
    parser.add_argument("--test-shift", type=int, default=0,
                        help="also score codes averaged over mirrors and four diagonal shifts by this many stored pixels (0: mirrors only)")
    parser.add_argument("--distil", type=float, default=None,
                        help="train a teacher with these settings first, then the reported model with this weight x the mean squared "
                             "difference of its codes to the teacher's (a mean over bits) added to its loss (0: no such term; it still starts from "
                             "the teacher's centres); "
                             "the two models' codes averaged are scored too (default: one model, no teacher)")
    parser.add_argument("--student-seed", type=int, default=None, help="with --distil: the second model's initial weights' seed (default: --seed + 1000)")
    parser.add_argument("--label", default="base", help="names the settings in the results (rows are keyed by it)")
    parser.add_argument("--cache-dir", default=None, help="where caches are kept (default: a folder in the temp dir)")
    args = parser.parse_args(argv)
    check_designs(parser, args)
    if not args.timing and args.epochs % args.eval_every:
        parser.error(f"--eval-every {args.eval_every} must divide --epochs {args.epochs} (the last epoch is on the curve)")
    return args


def main() -> None:
    args = parse_args()
    ds = load_cifar10(seed=args.seed)
    row = (timing if args.timing else run)(args, ds.inputs["image"], ds.labels, ds.split)
    print(json.dumps({k: v for k, v in row.items() if k not in ("recipe",)}), flush=True)
    path = RESULTS_DIR / "trunk_cache.json"
    rows = json.loads(path.read_text())["rows"] if path.is_file() else []
    key = ("label", "backbone", "mode", "method", "bits", "size", "seed")
    rows = [r for r in rows if tuple(r.get(k, "squeezenet") for k in key) != tuple(row[k] for k in key)] + [row]
    write_results("trunk_cache", {"rows": rows, "scdh_table_i_alexnet": SCDH_TABLE_I_ALEXNET}, markdown(rows))


def check_designs(parser: argparse.ArgumentParser, args) -> None:
    """Refuse ``--test-shift``, ``--distil`` and ``--student-seed`` values the run cannot honour,
    before anything is loaded (``parser.error``: usage and exit status 2)."""
    if not 0 <= args.test_shift <= 16:
        parser.error(f"--test-shift {args.test_shift}: a shift of 0 to 16 stored pixels (CIFAR-10's pictures are 32x32)")
    if args.distil is not None and not (math.isfinite(args.distil) and args.distil >= 0):
        parser.error(f"--distil {args.distil}: the distillation weight is a finite number >= 0 (0: no distillation term)")
    if args.student_seed is not None and args.distil is None:
        parser.error("--student-seed names the second model's seed; it needs --distil")
    if args.distil is not None and args.method == "HyP2":
        parser.error("--distil: HyP2's learned proxies are not copied to the second model, so its codes would not share the teacher's "
                     "frame (SCDH's centres are copied, HCLM's proxies are fixed); use SCDH or HCLM")
    if args.timing and (args.distil is not None or args.test_shift):
        parser.error("--timing measures seconds per epoch; --distil and --test-shift score quality: drop them or --timing")


def paired_designs(row: dict) -> str:
    """A row's numbers from its paired designs (``--test-shift``, ``--distil``), for its table:
    with shifts, the teacher's, and the ensemble of the two, which only the curve scores (empty
    without them)."""
    test = row["mode"] == "test"
    named = {"teacher": row.get("teacher", {}).get("mAP@all mirrored" if test else "curve mAP@all with flips"),
             f"{row.get('test shift')}-px shifts": row.get("mAP@all mirrored and shifted", row.get("curve mAP@all with flips and shifts")),
             "ensemble (on the curve)" if test else "ensemble": row.get("curve mAP@all with flips, with the teacher's codes")}  # fmt: skip
    return "; ".join(f"{name} {value:.4f}" for name, value in named.items() if value is not None)


def markdown(rows: list[dict]) -> str:
    rows = [{"backbone": "squeezenet", **r, "paired designs": paired_designs(r)} for r in rows]
    lines = ["# CIFAR-10, an ImageNet network trained above a cached frozen trunk (python -m benchmarks.trunk_cache)", "",
             "SCDH Table I, AlexNet fine-tuned, mAP@all: " + ", ".join(f"{b} bits {v}" for b, v in SCDH_TABLE_I_ALEXNET.items()),
             "", "## Test protocol (last epoch)", "",
             markdown_table([r for r in rows if r["mode"] == "test"],
                            ["label", "backbone", "method", "bits", "size", "cut", "views", "mixup", "precision", "epochs", "mAP@all", "P@H<=2",
                             "mAP@all mirrored", "P@H<=2 mirrored", "paired designs",
                             "cache + train seconds", "cache GB", "peak RSS GB", "seed", "cpu", "note"]), "",
             "## Validation (500 held-out training images against the other 500; 4,000 train)", "",
             markdown_table([{**r, "last mAP@all": r["curve"][-1]["mAP@all"] if r["curve"] else None,
                              "settings": json.dumps({**r["recipe"], **({"options": r["options"]} if r.get("options") else {})})}
                             for r in rows if r["mode"] == "validation"],
                            ["label", "backbone", "method", "bits", "size", "cut", "views", "mixup", "precision", "epochs", "last mAP@all",
                             "curve mAP@all with flips", "paired designs", "settings", "cache + train seconds", "seed", "cpu", "note"]), "",
             "## Seconds per epoch: cache against full fine-tuning (5,000 images, batch 64)", "",
             markdown_table([r for r in rows if r["mode"] == "timing"],
                            ["label", "backbone", "size", "cut", "views", "precision", "measured epochs", "cached seconds per epoch",
                             "full seconds per epoch", "speed-up", "cache build seconds", "cache disk GB", "peak RSS GB", "cpu"]), "",
             "## Curves (mAP@all by epoch)", ""]  # fmt: skip
    for r in rows:
        if r["curve"]:
            points = ", ".join(f"{p['epoch']}: {p['mAP@all']:.3f}" for p in r["curve"])
            averages = [key for key in r["curve"][0] if key.startswith("mAP@all ema")]
            points += "".join(f"; weights averaged at {key.split()[-1]}: " + ", ".join(f"{p[key]:.3f}" for p in r["curve"]) for key in averages)
            lines.append(f"- {r['mode']} {r['label']} {r['backbone']} {r.get('method', 'SCDH')} {r['bits']} bits {r['size']}px {r['precision']}, seed {r['seed']}: {points}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
