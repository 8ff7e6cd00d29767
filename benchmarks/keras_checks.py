"""What the Keras API's checks cost (tfhash.models.training): the time of one training step with
the in-graph checks (labels normalised and asserted inside the step, every weight asserted finite
after the optimizer step) against the same model without them, the checks' ops timed on their own,
and the one-off cost of the NumPy checks ``fit`` runs on arrays before the first step (finite
features, labels to multi-hot).

    python -m benchmarks.keras_checks [--seed 0] [--repeats 5] [--epochs 3]

Two models on MNIST's 5,000 training images: the main job's (SCDH, small CNN, 48 bits, batch 64)
and the pixels recipe's (SCDH on an MLP of 1,024 units over the 784 pixels, 16 bits, batch 128).
Each repeat times ``epochs`` epochs of each variant in turn, after one warm-up epoch; the table
gives the median milliseconds per step and the ratio checked / unchecked. Writes
``benchmarks/results/keras_checks.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import markdown_table, positive_int, write_results  # noqa: E402
from tfhash.data import load_mnist  # noqa: E402
from tfhash.labels import multi_hot  # noqa: E402
from tfhash.models import SCDHModel, build_scdh, mlp, small_cnn  # noqa: E402
from tfhash.models.inputs import checked_features  # noqa: E402


class UncheckedSCDH(SCDHModel):
    """SCDH without the in-graph checks: Keras's own training step, the labels taken as they come."""

    def train_step(self, data):
        return keras.Model.train_step(self, data)

    def unpack_targets(self, y):
        return y, None, None


def model_of(setup: str, checked: bool, seed: int):
    keras.utils.set_random_seed(seed)
    if setup == "small CNN, 48 bits, batch 64":
        backbone, bits = small_cnn((28, 28)), 48
    else:
        backbone, bits = mlp(784, (1024,)), 16
    model = build_scdh(backbone, 10, bits)
    if not checked:
        model = UncheckedSCDH(model.backbone, 10, bits, model.lam, model.mu, model.alpha)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    return model


def step_ms(model, x, y, batch: int, epochs: int) -> float:
    """Milliseconds per step over ``epochs`` epochs (the arrays pass the NumPy checks first, which
    :func:`numpy_check_ms` times separately)."""
    start = time.perf_counter()
    model.fit(x, y, epochs=epochs, batch_size=batch, verbose=0, shuffle=True)
    return 1000.0 * (time.perf_counter() - start) / (epochs * int(np.ceil(len(x) / batch)))


def graph_checks_ms(model, batch: int, loops: int = 200) -> float:
    """The in-graph checks of one step on their own: a batch of class ids normalised
    (:meth:`~tfhash.models.training.TrainingMixin.unpack_targets`) and every trainable weight
    asserted finite, ``loops`` times inside one ``tf.function`` (so no Python call is timed); the
    median over 7 runs, per loop."""
    import tensorflow as tf

    from tfhash.models.training import assert_finite_weights

    ids = tf.constant(np.arange(batch) % 10)

    @tf.function
    def checks():
        total = tf.constant(0.0)
        for _ in tf.range(loops):
            labels = model.unpack_targets(ids + tf.cast(total, ids.dtype) * 0)[0]
            assert_finite_weights(model.trainable_variables)
            total += tf.reduce_sum(labels) * 0.0
        return total

    checks()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        checks().numpy()
        times.append(1000.0 * (time.perf_counter() - start) / loops)
    return float(np.median(times))


def numpy_check_ms(x, ids, repeats: int) -> float:
    """The NumPy checks ``fit`` runs once on arrays: features finite, class ids to multi-hot."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        checked_features(x)
        multi_hot(ids, 10)
        times.append(1000.0 * (time.perf_counter() - start))
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--epochs", type=positive_int, default=3)
    args = parser.parse_args()
    train_x, train_y = load_mnist(seed=args.seed).part("train")
    ids = train_y.argmax(axis=1)
    inputs = {"small CNN, 48 bits, batch 64": (train_x["image"], 64),
              "MLP 1024 on pixels, 16 bits, batch 128": (train_x["image"].reshape(len(ids), -1).astype("float32") / 255.0, 128)}  # fmt: skip
    rows = []
    for setup, (x, batch) in inputs.items():
        models = {checked: model_of(setup, checked, args.seed) for checked in (True, False)}
        for model in models.values():
            model.fit(x, ids, epochs=1, batch_size=batch, verbose=0)  # warm-up: tracing
        times = {True: [], False: []}
        for _ in range(args.repeats):
            for checked, model in models.items():
                times[checked].append(step_ms(model, x, ids, batch, args.epochs))
        checked_ms, unchecked_ms = float(np.median(times[True])), float(np.median(times[False]))
        row = {"model": setup, "steps timed": args.repeats * args.epochs * int(np.ceil(len(x) / batch)),
               "ms/step checked": round(checked_ms, 2), "ms/step unchecked": round(unchecked_ms, 2),
               "ratio": round(checked_ms / unchecked_ms, 3),
               "ratio of minima": round(min(times[True]) / min(times[False]), 3),
               "min/max checked": [round(min(times[True]), 2), round(max(times[True]), 2)],
               "min/max unchecked": [round(min(times[False]), 2), round(max(times[False]), 2)],
               "graph checks alone ms/step": round(graph_checks_ms(models[True], batch), 3),
               "fit's NumPy checks, once (ms)": round(numpy_check_ms(x, ids, args.repeats), 1)}  # fmt: skip
        row["graph checks / step"] = round(row["graph checks alone ms/step"] / unchecked_ms, 4)
        print(row, flush=True)
        rows.append(row)
    columns = ["model", "ms/step checked", "ms/step unchecked", "ratio", "min/max checked", "min/max unchecked", "ratio of minima",
               "graph checks alone ms/step", "graph checks / step", "fit's NumPy checks, once (ms)"]  # fmt: skip
    text = "\n".join([
        "# Cost of the Keras API's checks", "",
        f"`python -m benchmarks.keras_checks --seed {args.seed} --repeats {args.repeats} --epochs {args.epochs}`: MNIST's "
        "5,000 training images, median ms per training step over the repeats (each repeat "
        f"{args.epochs} epochs per variant, the variants in turn, after a warm-up epoch). *Checked*: tfhash's training step "
        "(labels normalised and asserted in the graph, every weight asserted finite after the optimizer step); "
        "*unchecked*: Keras's own step on the same model. Whole steps on two shared cores vary by more than the checks "
        "cost, so the checks are also timed on their own (*graph checks alone*: the same ops compiled in one "
        "`tf.function` loop of 200 iterations, so no Python call is timed; median of 7) and given as a share of the unchecked step. The NumPy checks run once "
        "per `fit` on arrays.", "",
        markdown_table(rows, columns), ""])  # fmt: skip
    write_results("keras_checks", {"seed": args.seed, "repeats": args.repeats, "epochs": args.epochs, "rows": rows}, text)


if __name__ == "__main__":
    main()
