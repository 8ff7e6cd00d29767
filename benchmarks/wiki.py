"""JCCH on Wiki (cross-modal), beside the published values of SDMCH and DCH on the same split.

The fixed protocol: the 693 test pairs are the queries, the 2,173 training pairs the database and
the training set; 128-d SIFT words (image) and 10-d LDA topics (text), each standardised with the
training rows' statistics; mAP over the whole database in the stable tie order, image->text and
text->image. Each tower is :func:`tfhash.models.mlp` on its features; the recipe is a
:class:`tfhash.recipes.Recipe` (``--recipe recommended`` or ``paper-like``, or JSON over the
recommended one)::

    python -m benchmarks.wiki --bits 16 32 64 --seeds 0 1 2 --recipe recommended

``--validation`` chooses the recipe honestly: 500 training pairs, drawn with the seed, are the
queries, the other 1,673 the database and the training set (the protocol's shape: the database is
the training set), scored every ``--eval-every`` epochs. Rows accumulate in
``benchmarks/results/wiki.{json,md}`` or ``wiki_validation.{json,md}`` keyed by recipe label, bits
and seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import RESULTS_DIR, markdown_table, positive_int, write_results  # noqa: E402
from benchmarks.methods import standardised  # noqa: E402
from tfhash.data import load_wiki  # noqa: E402
from tfhash.labels import multi_hot  # noqa: E402
from tfhash.layers import input_map_layers  # noqa: E402
from tfhash.metrics import cross_modal_mean_average_precision, mean_average_precision  # noqa: E402
from tfhash.models import build_jcch, mlp  # noqa: E402
from tfhash.recipes import PAPER_LIKE, RECOMMENDED, Recipe  # noqa: E402

#: Published mAP on Wiki's fixed split (the project's peer bar quotes them), (I->T, T->I) by bits.
PUBLISHED = {
    "SDMCH (IJCAI 2018)": {32: (0.3843, 0.7670), 64: (0.3924, 0.7701)},
    "DCH": {32: (0.3589, 0.7097), 64: (0.3777, 0.7216)},
}
VALIDATION_QUERIES = 500
NAMED = {"recommended": RECOMMENDED["cross-modal"], "paper-like": PAPER_LIKE["cross-modal"]}


def parse_recipe(text: str) -> tuple[str, Recipe]:
    """``recommended``, ``paper-like``, or JSON settings over the recommended recipe. Returns
    ``(label, recipe)``.

    Raises:
        ValueError: an unknown setting or value.
    """
    if text in NAMED:
        return text, NAMED[text]
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--recipe takes {sorted(NAMED)} or a JSON object; {err}") from None
    if not isinstance(settings, dict):
        raise ValueError("--recipe JSON must be an object of Recipe settings")
    known = {f.name for f in dataclasses.fields(Recipe)} - {"method", "chosen"}
    if set(settings) - known:
        raise ValueError(f"unknown recipe settings {sorted(set(settings) - known)}; known: {sorted(known)}")
    if "hidden" in settings:
        settings["hidden"] = tuple(settings["hidden"])
    return json.dumps(settings, sort_keys=True), dataclasses.replace(RECOMMENDED["cross-modal"], **settings)


def wiki_data(seed: int, validation: bool):
    """``(train, query, database)`` as ``(inputs, labels)`` with standardised inputs; the
    validation split draws its queries from the training pairs with ``seed``."""
    ds = load_wiki(seed=seed)
    train, labels = ds.split.train, multi_hot(ds.labels)
    if validation:
        order = np.random.default_rng(seed).permutation(train)
        query, train = order[:VALIDATION_QUERIES], order[VALIDATION_QUERIES:]
    else:
        query = ds.split.query
    database = train  # the protocol: the training pairs are the database
    inputs = {m: standardised(x, train) for m, x in ds.inputs.items()}

    def part(rows):
        return {m: x[rows] for m, x in inputs.items()}, labels[rows]

    return part(train), part(query), part(database)


def score(model, query, database) -> dict:
    codes = {side: {m: model.encode(x, m) for m, x in part[0].items()} for side, part in (("q", query), ("db", database))}
    out = cross_modal_mean_average_precision(codes["q"], codes["db"], query[1], database[1])
    return {"I->T": float(out["image->text"]), "T->I": float(out["text->image"])}


class Curve(keras.callbacks.Callback):
    """Cross-modal mAP of the held-out pairs every ``every`` epochs."""

    def __init__(self, query, database, every: int):
        super().__init__()
        self.query, self.database, self.every, self.points = query, database, every, []

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every == 0:
            self.points.append({"epoch": epoch + 1, **score(self.model, self.query, self.database)})


def run(recipe: Recipe, bits: int, seed: int, validation: bool = False, every: int = 50) -> dict:
    """Train JCCH with ``recipe`` at ``bits`` and score it (the protocol's queries, or held-out
    training pairs with the curve every ``every`` epochs)."""
    if recipe.method != "jcch":
        raise ValueError(f"Wiki is cross-modal: the recipe's method must be jcch, got {recipe.method!r}")
    train, query, database = wiki_data(seed, validation)
    keras.utils.set_random_seed(seed)
    if isinstance(recipe.input_dropout, dict) and set(recipe.input_dropout) - set(train[0]):
        raise ValueError(f"input_dropout names {sorted(set(recipe.input_dropout) - set(train[0]))}; Wiki's towers are {sorted(train[0])}")
    towers = {m: mlp(x.shape[1], recipe.hidden, recipe.dropout, f"mlp_{m}", recipe.input_dropout_of(m),
                     input_map_layers(recipe.input_map_of(m), x, seed, name=f"mlp_{m}")) for m, x in train[0].items()}  # fmt: skip
    model = build_jcch(towers, train[1].shape[1], bits, seed=seed, **recipe.options)
    model.compile(optimizer=recipe.optimizer(int(np.ceil(len(train[1]) / recipe.batch_size))))
    callbacks = [Curve(query, database, every)] if validation else []
    start = time.perf_counter()
    history = model.fit(train[0], train[1], epochs=recipe.epochs, batch_size=recipe.batch_size, verbose=0, callbacks=callbacks)
    seconds = time.perf_counter() - start
    row = {"bits": bits, "seed": seed, "mode": "validation" if validation else "test", **score(model, query, database),
           "final l_q (both towers)": float(history.history["quantization"][-1]), "train_s": round(seconds, 1),
           "recipe": {k: v for k, v in dataclasses.asdict(recipe).items() if k != "chosen"}}  # fmt: skip
    if validation:
        row["curve"] = callbacks[0].points
    return row


def ranking_codes(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(query_codes, class_codes)``, +-1, such that a query's Hamming distance to class ``c``'s
    code falls as ``scores[q, c]`` rises: block ``c`` (``C - 1`` bits) of a query holds one +1 per
    class scored below ``c``, and class ``c``'s code is +1 on its own block only. A database coded
    by class then ranks in the order of the scores, so the metrics kernel scores that order."""
    n, classes = scores.shape
    width = classes - 1
    bits = -(-classes * width // 8) * 8
    ranks = np.argsort(np.argsort(scores, axis=1, kind="stable"), axis=1)  # 0 = lowest score
    queries = -np.ones((n, bits), np.int8)
    class_codes = -np.ones((classes, bits), np.int8)
    for c in range(classes):
        block = slice(c * width, (c + 1) * width)
        queries[:, block] = np.where(np.arange(width) < ranks[:, c : c + 1], 1, -1)
        class_codes[c, block] = 1
    return queries, class_codes


def image_ceiling(seed: int, strengths=(0.003, 0.01, 0.03, 0.1)) -> list[dict]:
    """What the image features allow on the validation split: a logistic regression on them
    (L2, inverse strength ``C``), its accuracy on the held-out images, and image->text mAP when
    every text code sits exactly on its class and the image queries are ranked by the classifier's
    probabilities (``class ranking``) or by its top class only (``top class``)."""
    from sklearn.linear_model import LogisticRegression

    (train, train_y), (query, query_y), (database, database_y) = wiki_data(seed, validation=True)
    rows = []
    for strength in strengths:
        classifier = LogisticRegression(C=strength, max_iter=5000).fit(train["image"], train_y.argmax(axis=1))
        scores = classifier.predict_proba(query["image"])
        ranked, class_codes = ranking_codes(scores)
        top, _ = ranking_codes(np.eye(scores.shape[1])[scores.argmax(axis=1)])
        texts = class_codes[database_y.argmax(axis=1)]
        rows.append({"C": strength, "seed": seed, "accuracy": float((scores.argmax(axis=1) == query_y.argmax(axis=1)).mean()),
                     "I->T class ranking": mean_average_precision(ranked, texts, query_y, database_y),
                     "I->T top class": mean_average_precision(top, texts, query_y, database_y)})  # fmt: skip
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Mean and spread over seeds per recipe label and bits, beside the published values."""
    out = []
    for label, bits in sorted({(r["recipe label"], r["bits"]) for r in rows}):
        mine = [r for r in rows if (r["recipe label"], r["bits"]) == (label, bits)]
        entry = {"recipe label": label, "bits": bits, "seeds": len(mine)}
        for key in ("I->T", "T->I"):
            values = [r[key] for r in mine]
            entry[f"{key} mean"], entry[f"{key} std"] = float(np.mean(values)), float(np.std(values))
        for name, table in PUBLISHED.items():
            if bits in table:
                entry[name] = f"{table[bits][0]:.4f} / {table[bits][1]:.4f}"
        out.append(entry)
    return out


def markdown(rows: list[dict], validation: bool) -> str:
    lines = [f"# JCCH on Wiki (python -m benchmarks.wiki{' --validation' if validation else ''})", "",
             "Recipes by label:", ""]  # fmt: skip
    lines += [f"- {label}: `{recipe}`" for label, recipe in sorted({(r["recipe label"], json.dumps(r["recipe"])) for r in rows})]
    lines += [""]
    if validation:
        lines += ["500 held-out training pairs against the other 1,673 (which train).", "",
                  markdown_table(sorted(rows, key=lambda r: (r["bits"], r["recipe label"], r["seed"])),
                                 ["recipe label", "bits", "seed", "I->T", "T->I", "final l_q (both towers)", "train_s"]),
                  "", "## Curves (epoch: I->T / T->I)", ""]  # fmt: skip
        for r in rows:
            points = ", ".join(f"{p['epoch']}: {p['I->T']:.3f} / {p['T->I']:.3f}" for p in r["curve"])
            lines.append(f"- {r['recipe label']}, {r['bits']} bits, seed {r['seed']}: {points}")
        return "\n".join(lines) + "\n"
    published = list(PUBLISHED)
    lines += ["## Mean over seeds, beside the published values (I->T / T->I)", "",
              markdown_table(summary(rows), ["recipe label", "bits", "seeds", "I->T mean", "I->T std", "T->I mean", "T->I std",
                                             *published]),
              "", "## Every run", "",
              markdown_table(sorted(rows, key=lambda r: (r["recipe label"], r["bits"], r["seed"])),
                             ["recipe label", "bits", "seed", "I->T", "T->I", "final l_q (both towers)", "train_s"])]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bits", nargs="+", type=int, default=[16, 32, 64])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--recipe", default="recommended", help=f"{sorted(NAMED)} or JSON settings over the recommended recipe")
    parser.add_argument("--validation", action="store_true")
    parser.add_argument("--eval-every", type=positive_int, default=50)
    parser.add_argument("--ceiling", action="store_true",
                        help="only the image features' ceiling on the validation split (logistic regression) -> wiki_ceiling.md")  # fmt: skip
    args = parser.parse_args()
    if args.ceiling:
        rows = [row for seed in args.seeds for row in image_ceiling(seed)]
        for row in rows:
            print(json.dumps(row), flush=True)
        write_results("wiki_ceiling", {"rows": rows}, "\n".join([
            "# What Wiki's image features allow (python -m benchmarks.wiki --ceiling)", "",
            "Validation split (500 held-out training pairs against the other 1,673). Logistic regression on the",
            "standardised SIFT words; image->text mAP with every text code on its class, image queries ranked by",
            "the classifier's probabilities or by its top class only.", "",
            markdown_table(rows, ["C", "seed", "accuracy", "I->T class ranking", "I->T top class"]), ""]))  # fmt: skip
        return
    try:
        label, recipe = parse_recipe(args.recipe)
    except (ValueError, TypeError) as err:
        parser.error(f"--recipe: {err}")
    if args.validation and recipe.epochs % args.eval_every:
        parser.error(f"--eval-every {args.eval_every} must divide the recipe's {recipe.epochs} epochs (the last epoch is on the curve)")
    name = "wiki_validation" if args.validation else "wiki"
    path = RESULTS_DIR / f"{name}.json"
    for bits in args.bits:
        for seed in args.seeds:
            row = {"recipe label": label, **run(recipe, bits, seed, args.validation, args.eval_every)}
            print(json.dumps({k: v for k, v in row.items() if k not in ("recipe", "curve")}), flush=True)
            key = ("recipe label", "bits", "seed")
            with open(path.with_suffix(".lock"), "w") as lock:  # runs side by side add their rows one at a time
                fcntl.flock(lock, fcntl.LOCK_EX)
                rows = json.loads(path.read_text())["rows"] if path.is_file() else []
                rows = [r for r in rows if tuple(r[k] for k in key) != tuple(row[k] for k in key)] + [row]
                write_results(name, {"rows": rows, "published": {n: {str(b): v for b, v in t.items()} for n, t in PUBLISHED.items()}},
                              markdown(rows, args.validation))  # fmt: skip


if __name__ == "__main__":
    main()
