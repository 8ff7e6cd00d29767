"""tfhash's methods on the peer protocol (docs/design.md s.11), against its bar.

Same inputs (digest-checked by :mod:`benchmarks.peer_data`), same splits, same head
(Dense(1024, ReLU) -> the method's hash layer, no dropout, no augmentation, no standardisation),
Adam 1e-3, batch 128, 50 epochs, reshuffled each epoch, the last epoch scored; mAP@all in the
stable tie order, and mAP@1000 on MIRFlickr. Each method is built by the benchmarks' public-builder
helpers with their defaults (:func:`benchmarks.methods.benchmark_model`,
:func:`benchmarks.methods.multilabel_benchmark_model`). The recommended recipes (``--recommended``)
depart from that training where validation chose to (head dropout, weight decay, a cosine
schedule; on MNIST Gaussian input noise, MT-SCDH's perturbation); the peers keep the protocol's.

Rows accumulate in ``benchmarks/results/peers.{json,md}`` (keyed by dataset, method, bits, seed; a
rerun replaces its row); the markdown states, per cell of the bar, the best tfhash method's mean
over the seeds run and its margin over the best peer::

    python -m benchmarks.peers --datasets mnist cifar10 mirflickr --bits 16 32 64 --seeds 0 1 2

``--recipe`` trains with other settings than the protocol's (JSON over :data:`PROTOCOL_RECIPE`:
head dropout, input standardisation with the training rows' statistics, Adam's weight decay
(AdamW), learning rate, schedule, epochs, and further :class:`tfhash.fine_tuning.FineTuning`
settings as ``fine_tuning``, e.g. ``{"fine_tuning": {"weight_averaging": 0.99}}``), and ``--options`` with the methods' own settings over
their defaults (e.g. HyP2's beta), both labelled by ``--label``; ``--recommended`` runs each
dataset's kind of data with :data:`tfhash.recipes.RECOMMENDED` (label ``recommended``);
``--semi-supervised`` runs MT-SCDH (``--methods MT-SCDH`` does too, unless ``--labelled-only``: it
also trains on the database rows outside the training rows, unlabelled) with :data:`tfhash.recipes.MEAN_TEACHER` (label
``semi-supervised``), reported against SCDH with the same recipe, not against the bar. ``--validation`` chooses them
honestly: it trains on the training rows minus a held-out part
(:func:`tfhash.data.splits.validation_split`: 100 per class, 50 of them queries, single-label; 2,000
at random, 500 queries, multi-label) and scores held-out queries against the held-out database every
``--eval-every`` epochs; training rows join the held-out database in the protocol's proportion
(8% on CIFAR-10, 7% on MNIST, 55% on MIRFlickr). Those rows go to ``peers_validation.{json,md}``.
MIRFlickr's mAP@1000 is scored on the validation database at the same share of it (1000 / 18,015).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import methods  # noqa: E402
from benchmarks.common import RESULTS_DIR, markdown_table, positive_int, write_results  # noqa: E402
from benchmarks.peer_data import DATASETS, load_peer_data  # noqa: E402
from tfhash.callbacks.retrieval_eval import RetrievalEvalCallback  # noqa: E402
from tfhash.data.splits import validation_split  # noqa: E402
from tfhash.recipes import MEAN_TEACHER, RECOMMENDED, Recipe  # noqa: E402

#: The protocol's training: no head dropout, raw inputs, Adam 1e-3 without weight decay, constant
#: rate, 50 epochs.
PROTOCOL_RECIPE = {"dropout": 0.0, "standardise": False, "weight_decay": 0.0, "learning_rate": 1e-3,
                   "schedule": "constant", "epochs": 50, "fine_tuning": {}}  # fmt: skip
HIDDEN = (1024,)
VALIDATION = {"single": {"held_out": 100, "queries": 50}, "multi": {"held_out": 2000, "queries": 500}}
MAP_DEPTH = 1000  # MIRFlickr's mAP@1000 on the 18,015-item database
SINGLE_LABEL = ("SCDH", "HCLM", "sHCLM", "sHCLM+triplet", "HyP2")
#: Run with ``--methods MT-SCDH`` or ``--semi-supervised`` (semi-supervised: it also sees the
#: database unlabelled, and is then compared with SCDH, not with the bar's peers, which see only
#: the training rows), and by ``--recommended`` on MNIST, whose recipe trains it on the training
#: rows alone (counted against the bar like the other methods).
MT_SCDH = "MT-SCDH"
#: The bar: best peer per cell, seed 0 (dataset, metric) -> bits -> (value, peer).
BAR = {
    ("mnist", "mAP@all"): {16: (0.9237, "OrthoHash"), 32: (0.9244, "softmax-K"), 64: (0.9375, "OrthoHash")},
    ("cifar10", "mAP@all"): {16: (0.5732, "softmax-K"), 32: (0.5911, "softmax-K"), 64: (0.5990, "softmax-K")},
    ("mirflickr", "mAP@all"): {16: (0.7290, "DPSH"), 32: (0.7462, "DPSH"), 64: (0.7593, "HashNet")},
    ("mirflickr", "mAP@1000"): {16: (0.8101, "HyP2"), 32: (0.8217, "HyP2 (own optimizer)"), 64: (0.8336, "HyP2")},
}  # fmt: skip
MARGIN = 0.01  # the margin over the best peer that counts as beating the bar


def checked_recipe(recipe: dict) -> dict:
    """``recipe`` over :data:`PROTOCOL_RECIPE`, every value checked.

    Raises:
        ValueError: an unknown setting or a value out of range.
    """
    unknown = set(recipe) - set(PROTOCOL_RECIPE)
    if unknown:
        raise ValueError(f"unknown recipe settings {sorted(unknown)}; known: {sorted(PROTOCOL_RECIPE)}")
    full = {**PROTOCOL_RECIPE, **recipe}
    Recipe(method="scdh", **{k: v for k, v in full.items() if k != "standardise"})  # the recipe's own checks of each value
    return full


def optimizer(method: str, recipe: dict, steps_per_epoch: int):
    """The optimizer of benchmark row ``method`` under ``recipe`` (its rates, schedule, epochs and
    further fine-tuning settings, through :meth:`tfhash.recipes.Recipe.optimizer`)."""
    settings = {k: recipe[k] for k in ("learning_rate", "weight_decay", "schedule", "epochs", "fine_tuning")}
    return Recipe(method=methods.method_of(method)[0], **settings).optimizer(steps_per_epoch)


#: The kind of data of each protocol dataset (a key of :data:`tfhash.recipes.RECOMMENDED`).
KINDS = {"mnist": "single-label pixels", "cifar10": "single-label", "mirflickr": "multi-label"}


def recommended(dataset: str) -> tuple[str, dict, dict]:
    """``(method, recipe, options)`` of tfhash's recommended recipe for ``dataset``'s kind of data."""
    chosen = RECOMMENDED[KINDS[dataset]]
    recipe = checked_recipe({"dropout": chosen.dropout, "weight_decay": chosen.weight_decay, "learning_rate": chosen.learning_rate,
                             "schedule": chosen.schedule, "epochs": chosen.epochs, "fine_tuning": dict(chosen.fine_tuning)})  # fmt: skip
    if chosen.hidden != HIDDEN or chosen.input_dropout or chosen.batch_size != methods.BATCH:
        raise ValueError(f"the {KINDS[dataset]} recipe changes the protocol's head or batch; this benchmark keeps them")
    return methods.row_name(chosen.method, chosen.options), recipe, dict(chosen.options)


def unlabelled_rows(data, x: np.ndarray) -> np.ndarray:
    """MT-SCDH's unlabelled rows: the protocol's database rows outside its training rows (54,000 on
    CIFAR-10, 64,000 on MNIST; never a query, and in validation never a held-out row)."""
    return x[np.setdiff1d(data.split.database, data.split.train)]


def mean_teacher(method: str) -> bool:
    """Whether a benchmark row name trains MT-SCDH (``"MT-SCDH"`` or a ``"MT-SCDH w=<w>"`` variant)."""
    return method.startswith(MT_SCDH)


def semi_supervised_row(row: dict) -> bool:
    """Whether a result row trained on unlabelled database rows too (those rows are compared with
    SCDH, not with the bar's peers, which see only the training rows)."""
    return row.get("unlabelled rows", 0) > 0


class Curve(keras.callbacks.Callback):
    """Records the validation scores the retrieval callbacks placed before it log."""

    def __init__(self, names):
        super().__init__()
        self.names, self.points = names, []

    def on_epoch_end(self, epoch, logs=None):
        if logs and self.names[0] in logs:
            self.points.append({"epoch": epoch + 1, **{name: float(logs[name]) for name in self.names}})


def run(data, method: str, bits: int, seed: int, recipe: dict, validation: bool = False, every: int = 10,
        options: dict | None = None, unlabelled: bool = False) -> dict:  # fmt: skip
    """Train ``method`` (with the model ``options`` over its defaults) with ``recipe`` and score it:
    on the protocol's queries and database, or (``validation``) on a held-out part of the training
    rows, with the curve every ``every`` epochs. ``unlabelled``: MT-SCDH trains on the database's
    unlabelled rows too (:func:`unlabelled_rows`; without them, on the training rows alone)."""
    recipe = checked_recipe(recipe)
    split, labels = data.split, data.labels
    kind = "single" if data.single_label else "multi"
    if validation:
        share = np.isin(split.database, split.train).mean()  # the protocol's share of training rows in the database
        split = validation_split(split.train, labels, seed=seed, train_in_database=float(share), **VALIDATION[kind])
    x = methods.standardised(data.x, split.train) if recipe["standardise"] else data.x
    head = {"hidden": HIDDEN, "dropout": recipe["dropout"]}
    options = dict(options or {})
    epochs, extra = recipe["epochs"], {}
    if unlabelled:
        extra = {"unlabelled": unlabelled_rows(data, x)}
    build = methods.benchmark_model if data.single_label else methods.multilabel_benchmark_model
    model, fit_x, fit_y = build(method, x[split.train], labels[split.train], bits, seed, **head, **extra, **options)
    if unlabelled:  # as many passes over the labelled rows as the recipe's epochs
        epochs = max(1, round(epochs * len(split.train) / int((fit_y.sum(axis=1) > 0).sum())))
        every = 1
    depth = round(MAP_DEPTH * len(split.database) / len(data.split.database)) if validation else MAP_DEPTH
    map_at = () if data.single_label else (depth,)
    callbacks = []
    if validation:
        q, db = (x[split.query], labels[split.query]), (x[split.database], labels[split.database])
        callbacks = [RetrievalEvalCallback(*q, *db, frequency=every, prefix="curve_all_")]
        callbacks += [RetrievalEvalCallback(*q, *db, top_r=r, frequency=every, prefix=f"curve_{r}_") for r in map_at]
        callbacks.append(Curve(["curve_all_map"] + [f"curve_{r}_map" for r in map_at]))
    steps = int(np.ceil(len(fit_x) / methods.BATCH)) * epochs / recipe["epochs"]  # the schedule spans the whole run
    scores = methods.fit_and_score(model, fit_x, fit_y, x[split.query], labels[split.query], x[split.database],
                                   labels[split.database], epochs, seed, map_at=map_at,
                                   optimizer=optimizer(method, recipe, steps), callbacks=callbacks, precision_at=None)  # fmt: skip
    scores["unlabelled rows"] = len(extra["unlabelled"]) if unlabelled else 0
    if depth != MAP_DEPTH and f"mAP@{depth}" in scores:
        scores["mAP@1000"] = scores.pop(f"mAP@{depth}")  # the validation stand-in for mAP@1000
    row = {"dataset": data.name, "method": method, "bits": bits, "mode": "validation" if validation else "test",
           "recipe": recipe, "options": options, **scores}  # fmt: skip
    if validation:
        row["curve"] = [{"epoch": p["epoch"], "mAP@all": p["curve_all_map"],
                         **({"mAP@1000": p[f"curve_{depth}_map"]} if map_at else {})}
                        for p in callbacks[-1].points]  # fmt: skip
    return row


def margins(rows: list[dict]) -> list[dict]:
    """Per recipe and cell of the bar: the best method's mean over its seeds and its margin."""
    out = []
    for label in sorted({r["recipe label"] for r in rows}):
        for (dataset, metric), cells in BAR.items():
            for bits, (bar, peer) in cells.items():
                mine = [r for r in rows if (r["recipe label"], r["dataset"], r["bits"]) == (label, dataset, bits)
                        and not semi_supervised_row(r)]  # fmt: skip
                values: dict = {}
                for r in mine:
                    values.setdefault(r["method"], []).append(r[metric])
                if not values:
                    continue
                best = max(values, key=lambda m: np.mean(values[m]))
                mean = float(np.mean(values[best]))
                out.append({"recipe": label, "dataset": dataset, "metric": metric, "bits": bits,
                            "best peer": f"{bar:.4f} {peer}", "best tfhash": best, "mean": mean,
                            "std": float(np.std(values[best])), "seeds": len(values[best]), "margin": mean - bar,
                            "+0.01 met": "yes" if mean >= bar + MARGIN else "no"})  # fmt: skip
    return out


def semi_supervised(rows: list[dict]) -> list[dict]:
    """MT-SCDH against SCDH trained with the same recipe and SCDH's defaults (under the label with the
    most seeds in common), per MT-SCDH label, dataset and bits: means over the seeds both ran."""
    out = []
    for label, dataset, bits in sorted({(r["recipe label"], r["dataset"], r["bits"]) for r in rows if mean_teacher(r["method"])}):
        cell = [r for r in rows if (r["dataset"], r["bits"]) == (dataset, bits)]
        mt = {r["seed"]: r for r in cell if mean_teacher(r["method"]) and r["recipe label"] == label}
        recipe = next(iter(mt.values()))["recipe"]
        same = [r for r in cell if r["method"] == "SCDH" and r["recipe"] == recipe and not r["options"]]
        runs: dict = {}
        for r in same:
            runs.setdefault(r["recipe label"], {})[r["seed"]] = r["mAP@all"]
        if not runs:
            continue
        base = min(runs, key=lambda label: (-len(set(runs[label]) & set(mt)), label))  # most seeds in common
        scdh = runs[base]
        seeds = sorted(set(mt) & set(scdh))
        if not seeds:
            continue
        gains = [mt[s]["mAP@all"] - scdh[s] for s in seeds]
        out.append({"MT-SCDH label": label, "SCDH label": base, "dataset": dataset, "bits": bits, "seeds": len(seeds),
                    "unlabelled rows": max(r.get("unlabelled rows", 0) for r in mt.values()),
                    "MT-SCDH": float(np.mean([mt[s]["mAP@all"] for s in seeds])), "SCDH": float(np.mean([scdh[s] for s in seeds])),
                    "gain": float(np.mean(gains)), "gain std": float(np.std(gains)),
                    "MT-SCDH ahead": "yes" if np.mean(gains) > 0 else "no"})  # fmt: skip
    return out


def semi_supervised_lines(rows: list[dict]) -> list[str]:
    table = semi_supervised(rows)
    if not table:
        return []
    return ["## MT-SCDH (with the unlabelled database, or on the training rows only) against SCDH (the training rows only)", "",
            "MT-SCDH makes as many passes over the labelled rows as the recipe's epochs; with unlabelled rows, its curve's",
            "epochs are passes over its whole input (labelled rows repeated to half of it, plus the unlabelled rows).", "",
            markdown_table(table, ["MT-SCDH label", "SCDH label", "dataset", "bits", "seeds", "unlabelled rows", "MT-SCDH", "SCDH", "gain",
                                   "gain std", "MT-SCDH ahead"]), ""]  # fmt: skip


def markdown(rows: list[dict], checks: dict, validation: bool) -> str:
    title = "# tfhash on the peer protocol (python -m benchmarks.peers" + (" --validation)" if validation else ")")
    checked = "; ".join(f"{d}: " + ", ".join(f"{part} {how}" for part, how in sorted(c.items())) for d, c in sorted(checks.items()))
    lines = [title, "", f"Inputs checked against the protocol: {checked}.", "", "Recipes and model options by label:", ""]
    settings = {(r["recipe label"], r["dataset"], r["method"]): (r["recipe"], r.get("options", {})) for r in rows}
    lines += [f"- {label}, {dataset} {method}: recipe {json.dumps(recipe)}" + (f", options {json.dumps(options)}" if options else "")
              for (label, dataset, method), (recipe, options) in sorted(settings.items())] + [""]  # fmt: skip
    if validation:
        lines += ["Held-out training rows scored against held-out training rows (mAP@1000: R scaled to the", "database's share).", "",
                  markdown_table(sorted(rows, key=lambda r: (r["dataset"], r["bits"], r["method"], r["recipe label"], r["seed"])),
                                 ["dataset", "method", "bits", "recipe label", "seed", "mAP@all", "mAP@1000", "train_s"]),
                  "", *semi_supervised_lines(rows), "## Curves", ""]  # fmt: skip
        for r in rows:
            points = ", ".join(f"{p['epoch']}: {p['mAP@all']:.3f}" + (f"/{p['mAP@1000']:.3f}" if "mAP@1000" in p else "")
                               for p in r["curve"])  # fmt: skip
            lines.append(f"- {r['dataset']} {r['method']} {r['bits']} bits, {r['recipe label']}, seed {r['seed']}: {points}")
        return "\n".join(lines) + "\n"
    lines += ["## Margin over the best peer (mean over the seeds run)", "",
              markdown_table(margins(rows), ["recipe", "dataset", "metric", "bits", "best peer", "best tfhash", "mean", "std",
                                             "seeds", "margin", "+0.01 met"]), "",
              "MT-SCDH rows trained on the database's unlabelled rows too are left out of the margins (the peers see the "
              "training rows only); MT-SCDH on the training rows alone counts like the other methods.", "",
              *semi_supervised_lines(rows),
              "## Every run", "",
              markdown_table(sorted(rows, key=lambda r: (r["recipe label"], r["dataset"], r["method"], r["bits"], r["seed"])),
                             ["recipe label", "dataset", "method", "bits", "seed", "mAP@all", "mAP@1000", "train_s"])]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", choices=DATASETS, help="default: all (the single-label ones with --semi-supervised)")
    parser.add_argument("--methods", nargs="+", help="default: every method for the dataset's label type")
    parser.add_argument("--bits", nargs="+", type=int, default=[16, 32, 64])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--recipe", type=json.loads, default={}, help="settings over PROTOCOL_RECIPE, as JSON")
    parser.add_argument("--options", type=json.loads, default={}, help="the methods' own settings (e.g. HyP2's beta), as JSON")
    parser.add_argument("--label", default="protocol", help="names the recipe in the results (rows are keyed by it)")
    parser.add_argument("--recommended", action="store_true",
                        help="tfhash.recipes.RECOMMENDED for each dataset's kind of data: its method, options and recipe, "
                             "labelled 'recommended'")  # fmt: skip
    parser.add_argument("--semi-supervised", action="store_true",
                        help="MT-SCDH with tfhash.recipes.MEAN_TEACHER for each single-label dataset's kind of data and "
                             "the protocol's recipe, labelled 'semi-supervised' (compared with SCDH, not the bar)")  # fmt: skip
    parser.add_argument("--labelled-only", action="store_true",
                        help="MT-SCDH trains on the training rows only, not on the database's unlabelled rows too "
                             "(as the recommended recipes always do)")  # fmt: skip
    parser.add_argument("--validation", action="store_true")
    parser.add_argument("--eval-every", type=positive_int, default=10)
    parser.add_argument("--cache", default="runs/cache", help="where the CIFAR-10 features are kept")
    parser.add_argument("--no-feature-check", action="store_true",
                        help="skip the CIFAR-10 feature digest (float rounding on another TF build or CPU)")
    args = parser.parse_args()
    if args.recommended and args.semi_supervised:
        parser.error("choose --recommended or --semi-supervised")
    if args.labelled_only and (args.recommended or args.semi_supervised or args.label == "protocol"
                               or not any(mean_teacher(m) for m in args.methods or ())):  # fmt: skip
        parser.error("--labelled-only is for --methods MT-SCDH with a --label of its own: recommended recipes train on the "
                     "training rows only, --semi-supervised on the unlabelled rows too")  # fmt: skip
    if (args.recommended or args.semi_supervised) and (args.recipe or args.options or args.methods or args.label != "protocol"):
        parser.error("--recommended and --semi-supervised set the method, recipe, options and label themselves")
    single = [d for d in DATASETS if KINDS[d] in MEAN_TEACHER]
    if args.semi_supervised and not set(args.datasets or single) <= set(single):
        parser.error(f"--semi-supervised is for the single-label datasets ({', '.join(single)})")
    args.datasets = args.datasets or (single if args.semi_supervised else list(DATASETS))
    if (args.recipe or args.options) and args.label == "protocol":
        parser.error("name a recipe other than the protocol's with --label")
    try:
        epochs = [recommended(d)[1]["epochs"] for d in args.datasets] if args.recommended else [checked_recipe(args.recipe)["epochs"]]
    except (ValueError, TypeError) as err:
        parser.error(f"--recipe: {err}")
    uneven = [e for e in epochs if e % args.eval_every]
    if args.validation and uneven and not args.semi_supervised:  # MT-SCDH's curve is every pass (see run)
        parser.error(f"--eval-every {args.eval_every} must divide the recipe's {uneven[0]} epochs (the last epoch is on the curve)")
    name = "peers_validation" if args.validation else "peers"
    path = RESULTS_DIR / f"{name}.json"
    previous = json.loads(path.read_text()) if path.is_file() else {"rows": [], "checks": {}}
    rows, checks = previous["rows"], previous["checks"]
    for dataset in args.datasets:
        data = load_peer_data(dataset, cache_dir=args.cache, check_features=not args.no_feature_check)
        checks[dataset] = data.checks
        names = args.methods or (SINGLE_LABEL if data.single_label else methods.MULTI_LABEL_METHODS)
        recipe, options, label = args.recipe, args.options, args.label
        if args.recommended:
            method, recipe, options = recommended(dataset)
            names, label = [method], "recommended"
        if args.semi_supervised:
            names, options, label = [MT_SCDH], dict(MEAN_TEACHER[KINDS[dataset]]["options"]), "semi-supervised"
        for method in names:
            semi = mean_teacher(method) and not (args.recommended or args.labelled_only)
            if any((r["dataset"], r["method"], r["recipe label"]) == (dataset, method, label) and semi_supervised_row(r) != semi
                   for r in rows):  # fmt: skip
                parser.error(f"label {label!r} holds {dataset} {method} rows {'without' if semi else 'with'} unlabelled rows "
                             "(a label's rows are compared together); name this run with another --label")  # fmt: skip
            for bits in args.bits:
                for seed in args.seeds:
                    try:
                        row = run(data, method, bits, seed, recipe, args.validation, args.eval_every, options, unlabelled=semi)
                    except (TypeError, ValueError) as err:  # a model option its builder does not take, or a bad value
                        parser.error(f"--options for {method}: {err}")
                    row["recipe label"] = label
                    print(json.dumps({k: v for k, v in row.items() if k not in ("recipe", "options", "curve")}), flush=True)
                    key = ("dataset", "method", "bits", "seed", "recipe label")
                    rows = [r for r in rows if tuple(r[k] for k in key) != tuple(row[k] for k in key)] + [row]
                    bar = {f"{d} {m}": c for (d, m), c in BAR.items()}
                    write_results(name, {"rows": rows, "checks": checks, "bar": bar}, markdown(rows, checks, args.validation))


if __name__ == "__main__":
    main()
