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
import itertools
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
from tfhash.metrics import cross_modal_mean_average_precision, mean_average_precision  # noqa: E402
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


def encode_both(model, query, database) -> dict:
    """``{"q": {modality: codes}, "db": {modality: codes}}`` of the query and database parts."""
    return {side: {m: model.encode(x, m) for m, x in part[0].items()} for side, part in (("q", query), ("db", database))}


def score(model, query, database, codes: dict | None = None) -> dict:
    """Both directions' mAP; ``codes`` (:func:`encode_both`) when the caller has them already."""
    codes = encode_both(model, query, database) if codes is None else codes
    out = cross_modal_mean_average_precision(codes["q"], codes["db"], query[1], database[1])
    return {"I->T": float(out["image->text"]), "T->I": float(out["text->image"])}


def on_centre(model, database_codes: dict, database_labels: np.ndarray) -> dict:
    """Per modality, the share of database codes nearest (in Hamming distance) to their own class's
    centre: how closely each tower fits the training rows it encodes for the other's queries."""
    centres = np.sign(np.asarray(model.clusters.centres))
    return {f"{m} db on centre": float(((codes @ centres.T).argmax(axis=1) == database_labels.argmax(axis=1)).mean())
            for m, codes in database_codes.items()}  # fmt: skip


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
    model = recipe.build(train[0], train[1], bits, seed)
    callbacks = [Curve(query, database, every)] if validation else []
    start = time.perf_counter()
    history = model.fit(train[0], train[1], epochs=recipe.epochs, batch_size=recipe.batch_size, verbose=0, callbacks=callbacks)
    seconds = time.perf_counter() - start
    codes = encode_both(model, query, database)
    row = {"bits": bits, "seed": seed, "mode": "validation" if validation else "test", **score(model, query, database, codes),
           **on_centre(model, codes["db"], database[1]),
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


def classifiers() -> dict:
    """The per-modality functions the ceiling tries, by name: ``{"image": {...}, "text": {...}}``
    of unfitted scikit-learn classifiers with ``predict_proba`` (seeded). Each plays both of its
    modality's roles, as a hash function does: query ranking and database code."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.neural_network import MLPClassifier
    from sklearn.svm import SVC

    def svc(c, gamma="scale"):
        return SVC(C=c, gamma=gamma, probability=True, random_state=0)

    text = {"logistic C=0.01": LogisticRegression(C=0.01, max_iter=5000), "logistic C=1": LogisticRegression(C=1.0, max_iter=5000),
            "1-NN": KNeighborsClassifier(1)}  # fmt: skip
    text.update({f"RBF SVM C={c} gamma={g}": svc(c, g) for c in (1, 10, 100, 1000) for g in (0.1, 0.3, 1.0, 3.0)})
    text.update({f"MLP 512-512 L2={a}": MLPClassifier((512, 512), alpha=a, max_iter=1000, random_state=0) for a in (1e-4, 1e-2, 1.0)})
    return {"image": {f"RBF SVM C={c}": svc(c) for c in (1, 10, 100)}, "text": text}


def ceiling(seed: int) -> list[dict]:
    """What a hash function of each modality's features could reach at best, with ideal codes: one
    row per (image function, text function) of :func:`classifiers`, fitted on the training rows
    of the validation split (``seed``) and of the fixed test split. Queries are ranked by their
    function's class probabilities (:func:`ranking_codes`, which needs 96 bits: more than any code
    here); every database item sits on the class its own modality's function predicts for it. A
    function that ranks held-out queries well and one that places the database rows it trained on
    on their class are the same function here, as they are in a hash model."""
    rows: dict[tuple, dict] = {}
    for split, validation in (("validation", True), ("test", False)):
        (train, train_y), (query, query_y), (database, database_y) = wiki_data(seed, validation)
        fitted = {m: {name: clf.fit(train[m], train_y.argmax(axis=1)) for name, clf in table.items()}
                  for m, table in classifiers().items()}  # fmt: skip
        ranked = {m: {name: ranking_codes(f.predict_proba(query[m])) for name, f in table.items()} for m, table in fitted.items()}
        placed = {m: {name: f.predict(database[m]) for name, f in table.items()} for m, table in fitted.items()}
        accuracy = {m: {name: float((f.predict(query[m]) == query_y.argmax(axis=1)).mean()) for name, f in table.items()}
                    for m, table in fitted.items()}  # fmt: skip
        for image, text in itertools.product(fitted["image"], fitted["text"]):
            row = rows.setdefault((image, text), {"image function": image, "text function": text, "seed": seed})
            for m, name in (("image", image), ("text", text)):
                row[f"{split} {m} db on class"] = float((placed[m][name] == database_y.argmax(axis=1)).mean())
                row[f"{split} {m} query accuracy"] = accuracy[m][name]
            for direction, (q, d, q_name, d_name) in {"I->T": ("image", "text", image, text), "T->I": ("text", "image", text, image)}.items():
                codes, class_codes = ranked[q][q_name]
                row[f"{split} {direction}"] = mean_average_precision(codes, class_codes[placed[d][d_name]], query_y, database_y)
    return list(rows.values())


def ceiling_markdown(rows: list[dict]) -> str:
    """The ceiling's page: every pair of functions on both splits, and what clears SDMCH + 0.01."""
    bar = tuple(v + 0.01 for v in PUBLISHED["SDMCH (IJCAI 2018)"][32])
    clears = [r for r in rows if r["test I->T"] >= bar[0] and r["test T->I"] >= bar[1]]
    chosen = max(rows, key=lambda r: (r["validation I->T"] + r["validation T->I"]) / 2)
    reach_i = max((r["test T->I"] for r in rows if r["test I->T"] >= bar[0]), default=float("nan"))
    reach_t = max((r["test I->T"] for r in rows if r["test T->I"] >= bar[1]), default=float("nan"))
    columns = ["image function", "text function", "seed", "validation I->T", "validation T->I", "validation text db on class",
               "validation text query accuracy", "test I->T", "test T->I", "test text db on class", "test text query accuracy",
               "test image db on class"]  # fmt: skip
    return "\n".join([
        "# What Wiki's features allow a pair of hash functions (python -m benchmarks.wiki --ceiling)", "",
        "Each modality's function (scikit-learn, fitted on the split's training rows) plays both of its roles, as",
        "a hash function does: it ranks the classes for a query, and it places each database row it trained on at",
        "the class it predicts. Queries are ranked by class probability with ideal 96-bit ranking codes and the",
        "database by class, so these are upper bounds for codes that rank the database by class. Validation:",
        "500 held-out training pairs against the other 1,673; test: the 693 fixed queries against the 2,173",
        "training pairs. The test columns are for this analysis only; no recipe is chosen on them.", "",
        f"- Bar (SDMCH at 32 bits + 0.01): I->T >= {bar[0]:.4f} and T->I >= {bar[1]:.4f} on test.",
        f"- Pairs clearing both on test: {len(clears)} of {len(rows)}.",
        f"- Best test T->I among pairs with test I->T >= {bar[0]:.4f}: {reach_i:.4f}; best test I->T among pairs with "
        f"test T->I >= {bar[1]:.4f}: {reach_t:.4f}.",
        f"- The pair validation chooses (mean of both directions): {chosen['image function']} / {chosen['text function']}, "
        f"validation {chosen['validation I->T']:.4f} / {chosen['validation T->I']:.4f}, test {chosen['test I->T']:.4f} / "
        f"{chosen['test T->I']:.4f}.", "",
        markdown_table(rows, columns), ""])  # fmt: skip


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
                                 ["recipe label", "bits", "seed", "I->T", "T->I", "image db on centre", "text db on centre",
                                  "final l_q (both towers)", "train_s"]),
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
                        help="only what pairs of classical per-modality functions allow, on both splits -> wiki_ceiling.md")  # fmt: skip
    args = parser.parse_args()
    if args.ceiling:
        rows = [row for seed in args.seeds for row in ceiling(seed)]
        write_results("wiki_ceiling", {"rows": rows}, ceiling_markdown(rows))
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
