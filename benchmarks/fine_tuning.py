"""CIFAR-10 through a fine-tuned ImageNet SqueezeNet v1.1, the papers' setting (SCDH Table I).

Protocol (docs/design.md s.5): 1,000 queries (100 per class), the other 59,000 are the database, 5,000
of it (500 per class) train; mAP over the whole ranking, stable and tie-aware, and P@H<=2. The
backbone runs on the 32x32 images resized to ``--size`` inside the model, fine-tuned end to end
with tfhash's default recipe for pretrained networks (:data:`tfhash.fine_tuning.FINE_TUNING_DEFAULTS`:
SGD momentum 0.9, backbone 0.001, new layers 0.01, weight decay 5e-4, rate x0.2 at 5/8 and 7/8 of
the epochs, random shift + flip), batch 64.

``--validation`` trains on 4,000 of the 5,000 training images and holds out the other 1,000 (100 per
class): every ``--eval-every`` epochs (a divisor of ``--epochs``) 500 of them are scored against the
other 500, images the network has not trained on, as the protocol's database mostly is. This curve
chooses the recipe and the epoch count, without the queries. Without it the full protocol runs for
``--epochs`` epochs; the curve then scores the queries against a fixed seeded sample of 5,000
database images, to show whether training has converged (the reported numbers are the last
epoch's, on the whole database).

Results accumulate in ``benchmarks/results/fine_tuning.{json,md}`` (one row per method, bits, size,
mode and seed; a rerun replaces its row)::

    python -m benchmarks.fine_tuning --methods SCDH --bits 48 --size 128 --epochs 24 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import RESULTS_DIR, markdown_table, write_results  # noqa: E402
from tfhash import proxies  # noqa: E402
from tfhash.callbacks.retrieval_eval import RetrievalEvalCallback  # noqa: E402
from tfhash.data import load_cifar10  # noqa: E402
from tfhash.data.splits import validation_split  # noqa: E402
from tfhash.fine_tuning import FineTuning  # noqa: E402
from tfhash.metrics import evaluate_retrieval  # noqa: E402
from tfhash.models import build_hclm, build_hyp2, build_scdh, image_backbone  # noqa: E402
from tfhash.optimizers import compile_fine_tuning  # noqa: E402

METHODS = ("SCDH", "HCLM", "sHCLM", "HyP2")
BATCH = 64
# SCDH Table I, AlexNet fine-tuned, mAP@all on CIFAR-10 at 12 / 24 / 32 / 48 bits.
SCDH_TABLE_I_ALEXNET = {12: 0.801, 24: 0.822, 32: 0.828, 48: 0.836}
GRID_BITS, GRID_SIZES = (16, 32, 48, 64), (224, 128)  # the evidence the results table is to hold


def build(method: str, bits: int, size: int, recipe: FineTuning, x_train, y_train, seed: int):
    backbone = image_backbone("squeezenet", (32, 32, 3), size=size, **recipe.backbone_options())
    if method == "SCDH":
        return build_scdh(backbone, 10, bits, preset="cifar10")
    if method in ("HCLM", "sHCLM"):
        similarity = None
        if method == "sHCLM":  # class similarity from the pretrained network's class-mean features
            features = backbone.predict(x_train, batch_size=256, verbose=0)
            similarity = proxies.class_mean_similarity(features, y_train.argmax(axis=1))
        return build_hclm(backbone, 10, bits, similarity=similarity, seed=seed)
    return build_hyp2(backbone, 10, bits)


class TimedRetrievalEval(RetrievalEvalCallback):
    """The library's retrieval callback, timed so that the curve's cost is left out of the
    training time."""

    seconds = 0.0

    def on_epoch_end(self, epoch, logs=None):
        start = time.perf_counter()
        super().on_epoch_end(epoch, logs)
        self.seconds += time.perf_counter() - start
        if logs and f"{self.prefix}map" in logs:
            print(f"  epoch {epoch + 1}: curve mAP@all {logs[f'{self.prefix}map']:.4f}", flush=True)


def run(method: str, bits: int, size: int, epochs: int, seed: int, validation: bool, every: int, images, labels, split,
        recipe_overrides: dict) -> dict:  # fmt: skip
    keras.utils.set_random_seed(seed)
    recipe = FineTuning.for_backbone("squeezenet", **recipe_overrides)
    if validation:
        carved = validation_split(split.train, labels, held_out=100, queries=50, seed=seed)  # per class
        train, curve_q, curve_db = carved.train, carved.query, carved.database
    else:
        train, curve_q = split.train, split.query
        curve_db = np.random.default_rng(seed).choice(split.database, 5000, replace=False)
    x_train, y_train = images[train], labels[train].astype("float32")
    model = build(method, bits, size, recipe, x_train, y_train, seed)
    steps = int(np.ceil(len(train) / BATCH))
    compile_fine_tuning(model, recipe, epochs, steps)
    curve = TimedRetrievalEval(images[curve_q], labels[curve_q], images[curve_db], labels[curve_db], frequency=every,
                               prefix="curve_")  # fmt: skip
    start = time.perf_counter()
    history = model.fit(x_train, y_train, batch_size=BATCH, epochs=epochs, shuffle=True, verbose=2, callbacks=[curve]).history
    train_seconds = time.perf_counter() - start - curve.seconds
    points = [{"epoch": every * (i + 1), "mAP@all": value, "loss": history["loss"][every * (i + 1) - 1]}
              for i, value in enumerate(history.get("curve_map", []))]  # fmt: skip
    row = {"method": method, "bits": bits, "size": size, "mode": "validation" if validation else "test", "seed": seed,
           "epochs": epochs, "train images": int(len(train)), "curve": points,
           "recipe": recipe.to_dict()}  # fmt: skip
    if not validation:
        start = time.perf_counter()
        report = evaluate_retrieval(model.encode(images[split.query]), model.encode(images[split.database]),
                                    labels[split.query], labels[split.database], tie_aware=True)  # fmt: skip
        row.update({"mAP@all": report.mean_average_precision(),
                    "mAP@all tie-aware": float(np.mean(report.tie_aware_average_precision)),
                    "P@H<=2": float(report.precision_at_radius(2)),
                    "encode + score seconds": round(time.perf_counter() - start, 1)})  # fmt: skip
    row["train seconds"] = round(train_seconds, 1)
    row["seconds per epoch"] = round(train_seconds / epochs, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["SCDH"], choices=METHODS)
    parser.add_argument("--bits", nargs="+", type=int, default=[48])
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=24)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--validation", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recipe", type=json.loads, default={}, help="FineTuning settings over the defaults, as JSON")
    parser.add_argument("--label", default="default", help="names the recipe in the results (rows are keyed by it)")
    args = parser.parse_args()
    if args.epochs % args.eval_every:
        parser.error(f"--eval-every {args.eval_every} must divide --epochs {args.epochs} (the last epoch is on the curve)")
    ds = load_cifar10(seed=args.seed)
    path = RESULTS_DIR / "fine_tuning.json"
    rows = json.loads(path.read_text())["rows"] if path.is_file() else []
    for method in args.methods:
        for bits in args.bits:
            row = run(method, bits, args.size, args.epochs, args.seed, args.validation, args.eval_every,
                      ds.inputs["image"], ds.labels, ds.split, args.recipe)  # fmt: skip
            row["recipe label"] = args.label
            print(json.dumps({k: v for k, v in row.items() if k not in ("curve", "recipe")}), flush=True)
            key = ("method", "bits", "size", "mode", "seed", "recipe label")
            rows = [r for r in rows if tuple(r[k] for k in key) != tuple(row[k] for k in key)] + [row]
            write_results("fine_tuning", {"rows": rows, "scdh_table_i_alexnet": SCDH_TABLE_I_ALEXNET}, markdown(rows))


def markdown(rows: list[dict]) -> str:
    test = [r for r in rows if r["mode"] == "test"]
    columns = ["method", "bits", "size", "recipe label", "epochs", "mAP@all", "mAP@all tie-aware", "P@H<=2", "train seconds", "seconds per epoch", "seed"]
    done = {(r["method"], r["bits"], r["size"]) for r in test}
    missing = [f"{m} {b} bits {s}px" for s in GRID_SIZES for m in METHODS for b in GRID_BITS if (m, b, s) not in done]
    lines = ["# CIFAR-10, SqueezeNet v1.1 fine-tuned end to end (python -m benchmarks.fine_tuning)", "",
             "SCDH Table I, AlexNet fine-tuned, mAP@all: " + ", ".join(f"{b} bits {v}" for b, v in SCDH_TABLE_I_ALEXNET.items()),
             "", "## Test protocol (last epoch)", "", markdown_table(test, columns), "",
             f"Not run yet ({len(missing)} of the grid): " + (", ".join(missing) or "none"), "",
             "## Curves (mAP@all by epoch)", "",
             "Validation curves score 500 held-out training images against the other 500 (4,000 train); test curves",
             "score the queries against a seeded sample of 5,000 database images.", ""]  # fmt: skip
    for r in rows:
        points = ", ".join(f"{p['epoch']}: {p['mAP@all']:.3f}" for p in r["curve"])
        lines.append(f"- {r['mode']} {r['method']} {r['bits']} bits {r['size']}px, recipe {r['recipe label']}, seed {r['seed']}: {points}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
