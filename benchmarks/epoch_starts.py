"""Idle epoch starts when training on a trunk cache (:mod:`tfhash.trunk_cache`).

``fit_on_cache`` trains on ``Cache.dataset``, one endless stream of epochs, with ``fit``'s
``steps_per_epoch``, so that Keras keeps one iterator for the whole run. The reference is the same
stream cut to one epoch (``take(steps)``) without ``steps_per_epoch``: Keras then makes a new
iterator at each epoch's end and again at the next one's start, freeing the one whose prefetching
thread had just entered the generator (what ``fit_on_cache`` did before). Both train the same model
from the same weights on the same cache, one after the other, ``--rounds`` times in turn.

Per epoch: its wall seconds, the seconds from its start to the end of its first step, and the
cores busy (the process's CPU seconds over wall seconds). CIFAR-10's 5,000 training images (test
protocol split of ``--seed``), the shipped recipe's network, side and cut (a cache of the same key
is reused, e.g. ``--cache-dir`` of ``benchmarks.trunk_cache``)::

    python -m benchmarks.epoch_starts --epochs 12 --rounds 1 --seed 0

Results: ``benchmarks/results/epoch_starts.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import cpu_description, markdown_table, write_results  # noqa: E402
from benchmarks.trunk_cache import BATCH, build, cached_recipe, make_backbone, run_policy  # noqa: E402
from tfhash.data import load_cifar10  # noqa: E402
from tfhash.optimizers import compile_fine_tuning  # noqa: E402
from tfhash.trunk_cache import build_cache, split_backbone  # noqa: E402

FORMS = ("endless, one iterator (fit_on_cache)", "one epoch per iterator (reference)")


class EpochClock(keras.callbacks.Callback):
    """Wall and CPU seconds of each epoch, and the wall seconds to the end of its first step."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.wall, self.cpu, self.first = time.perf_counter(), time.process_time(), None

    def on_train_batch_end(self, batch, logs=None):
        if self.first is None:
            self.first = time.perf_counter() - self.wall

    def on_epoch_end(self, epoch, logs=None):
        wall = time.perf_counter() - self.wall
        self.epochs.append({"wall": wall, "first step": self.first, "cores busy": (time.process_time() - self.cpu) / wall})


def train(args, recipe, images, labels, form: str) -> list[dict]:
    """One run of ``args.epochs`` epochs on the cache, fed in ``form``; the cache is built once
    (by the first run) and reused."""
    keras.utils.set_random_seed(args.seed)
    policy = run_policy(args.precision)
    keras.mixed_precision.set_global_policy(policy)
    try:
        split = split_backbone(make_backbone(args.backbone, args.size, recipe)(), recipe.trunk_cache.cut)
        model = build(args.method, args.bits, args.seed)(split.top)
        cache = build_cache(split, images, labels, recipe.trunk_cache.directory, args.backbone, recipe.trunk_cache.views,
                            recipe.augment, args.seed)  # fmt: skip
        steps = cache.steps_per_epoch(BATCH)
        compile_fine_tuning(model, recipe, args.epochs, steps)
        data, clock = cache.dataset(BATCH, args.seed, recipe.trunk_cache.mixup), EpochClock()
        if form == FORMS[0]:
            model.fit(data, epochs=args.epochs, steps_per_epoch=steps, callbacks=[clock], verbose=0)
        else:
            model.fit(data.take(steps), epochs=args.epochs, callbacks=[clock], verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return clock.epochs


def summary(form: str, round_: int, epochs: list[dict], seed: int, precision: str) -> dict:
    later = epochs[1:]  # the first epoch traces the step
    return {"form": form, "round": round_, "epochs": len(epochs), "seconds (epochs 2+)": round(sum(e["wall"] for e in later), 1),
            "median epoch s": round(float(np.median([e["wall"] for e in later])), 1),
            "first step s, max": round(max(e["first step"] for e in later), 2),
            "epoch starts over 5 s": sum(e["first step"] > 5 for e in later),
            "first step s, sum": round(sum(e["first step"] for e in later), 1),
            "cores busy, median": round(float(np.median([e["cores busy"] for e in later])), 2),
            "per epoch": [{k: round(v, 2) for k, v in e.items()} for e in epochs], "seed": seed, "precision": precision,
            "cpu": cpu_description()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backbone", default="efficientnet_lite1")
    parser.add_argument("--method", default="SCDH", choices=["SCDH", "HCLM", "HyP2"])
    parser.add_argument("--bits", type=int, default=48)
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--cut", default="block10")
    parser.add_argument("--views", type=int, default=8)
    parser.add_argument("--mixup", type=float, default=0.4)
    parser.add_argument("--recipe", type=json.loads, default={"schedule": "cosine"})
    parser.add_argument("--precision", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=1, help="each form runs this many times, the two in turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "tfhash-trunk-cache"))
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first epoch is not counted)")
    ds = load_cifar10(seed=args.seed)
    images, labels = ds.inputs["image"][ds.split.train], ds.labels[ds.split.train]
    recipe = cached_recipe(args, args.cache_dir)
    rows = []
    for round_ in range(args.rounds):
        for form in FORMS:
            epochs = train(args, recipe, images, labels, form)
            rows.append(summary(form, round_, epochs, args.seed, args.precision))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "per epoch"}), flush=True)
    command = ("python -m benchmarks.epoch_starts " + f"--backbone {args.backbone} --size {args.size} --cut {args.cut} --views {args.views} "
               f"--mixup {args.mixup} --precision {args.precision} --epochs {args.epochs} --rounds {args.rounds} --seed {args.seed}")  # fmt: skip
    columns = ["form", "round", "epochs", "seconds (epochs 2+)", "median epoch s", "first step s, max", "epoch starts over 5 s",
               "first step s, sum", "cores busy, median", "precision", "seed", "cpu"]  # fmt: skip
    md = "\n".join(["# Idle epoch starts on a trunk cache", "", f"Command: `{command}`. {args.backbone} at {args.size} px above "
                    f"`{args.cut}`, {args.views} views, CIFAR-10's 5,000 training images; the first epoch (tracing) is not counted. "
                    "`first step s`: from an epoch's start to the end of its first step.", "",
                    markdown_table(rows, columns), ""])  # fmt: skip
    write_results("epoch_starts", {"command": command, "rows": rows}, md)


if __name__ == "__main__":
    main()
