"""tfhash.tuning on the peer protocol: the tuned recipe against the fixed recommended one and the bar.

Per dataset, :func:`tfhash.tuning.tune` searches on the protocol's training rows only (its own
validation split, seed 0, whose database holds training rows in the protocol's share, at most 0.9)
at ``--tune-bits``; the chosen recipe is then trained on all training rows
at each of ``--bits`` over ``--seeds`` and scored on the protocol's queries against its database
(mAP@all; mAP@1000 on MIRFlickr). The search keeps the protocol's head (one hidden layer of 1024:
``hidden`` is fixed) so the comparison with the peers holds; everything else in
:data:`tfhash.tuning.SEARCH_SPACES` is searched. The recommended recipe's and the best peer's numbers
come from ``benchmarks/results/peers.json`` (same protocol, seeds 0-2). ``wiki`` (cross-modal) goes
through the same search on its 2,173 training pairs, is tested with :func:`benchmarks.wiki.run`
(I->T and T->I on the 693 test pairs) and compared with ``benchmarks/results/wiki.json``'s
recommended rows and the published SDMCH values::

    python -m benchmarks.tuning --datasets mnist cifar10 mirflickr wiki --tune-bits 32 --bits 16 32 64 --seeds 0 1 2

``--tune-each`` searches at each of ``--bits`` instead and tests each code length with the choice
made at it (the searches cost a few minutes on MNIST and MIRFlickr, about 15 on CIFAR-10). Rows
accumulate in ``benchmarks/results/tuning.{json,md}`` (a rerun replaces its dataset's rows).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace

import numpy as np

from benchmarks.common import RESULTS_DIR, markdown_table, positive_int, write_results
from benchmarks.peer_data import DATASETS, load_peer_data
from benchmarks.peers import BAR, HIDDEN, KINDS, MAP_DEPTH, MARGIN
from tfhash.metrics import evaluate_retrieval
from tfhash.recipes import Recipe
from tfhash.tuning import SEARCH_SPACES, Budget, tune

METRICS = {"mnist": ("mAP@all",), "cifar10": ("mAP@all",), "mirflickr": ("mAP@all", "mAP@1000"), "wiki": ("I->T", "T->I")}
WIKI = "wiki"
#: The largest share of training rows in the validation database (held-out rows keep the rest).
MAX_SHARE = 0.9
SDMCH = "SDMCH (IJCAI 2018)"


def wiki_bar(metric: str, bits: int) -> tuple[float, str] | None:
    """The published SDMCH value of ``metric`` (I->T / T->I) at ``bits``, when published."""
    from benchmarks.wiki import PUBLISHED

    values = PUBLISHED[SDMCH].get(bits)
    return None if values is None else (values[("I->T", "T->I").index(metric)], SDMCH)


def test_row(data, recipe: Recipe, bits: int, seed: int) -> dict:
    """Train ``recipe`` on all training rows and score the protocol's queries against its database."""
    split = data.split
    start = time.perf_counter()
    model = recipe.fit(data.x[split.train], data.labels[split.train], bits, seed=seed)
    seconds = time.perf_counter() - start
    q, db = model.encode(data.x[split.query]), model.encode(data.x[split.database])
    yq, ydb = data.labels[split.query], data.labels[split.database]
    row = {"mAP@all": evaluate_retrieval(q, db, yq, ydb).mean_average_precision(), "train_s": round(seconds, 1)}
    if "mAP@1000" in METRICS[data.name]:
        row["mAP@1000"] = evaluate_retrieval(q, db, yq, ydb, top_r=MAP_DEPTH).mean_average_precision()
    return row


def recommended_scores(dataset: str, bits: int, metric: str) -> list[float]:
    if dataset == WIKI:
        rows = json.loads((RESULTS_DIR / "wiki.json").read_text())["rows"]
        return [r[metric] for r in rows if (r.get("recipe label"), r["bits"]) == ("recommended", bits)]
    rows = json.loads((RESULTS_DIR / "peers.json").read_text())["rows"]
    return [r[metric] for r in rows if (r["recipe label"], r["dataset"], r["bits"]) == ("recommended", dataset, bits)]


def cells(tests: list[dict]) -> list[dict]:
    """Per dataset, metric and bits: the tuned mean and spread over seeds, the recommended recipe's,
    the best peer's, and the margins."""
    out = []
    for dataset, bits in sorted({(r["dataset"], r["bits"]) for r in tests}):
        runs = [r for r in tests if (r["dataset"], r["bits"]) == (dataset, bits)]
        for metric in METRICS[dataset]:
            tuned = [r[metric] for r in runs]
            fixed = recommended_scores(dataset, bits, metric)
            if dataset == WIKI:
                bar, peer = wiki_bar(metric, bits) or (float("nan"), "not published")
            else:
                bar, peer = BAR[(dataset, metric)][bits]
            mean = float(np.mean(tuned))
            out.append({"dataset": dataset, "metric": metric, "bits": bits, "tuned at": runs[0]["tuned at bits"],
                        "tuned method": runs[0]["method"], "tuned": mean, "tuned std": float(np.std(tuned)), "seeds": len(tuned),
                        "recommended": float(np.mean(fixed)) if fixed else None,
                        "recommended std": float(np.std(fixed)) if fixed else None,
                        "tuned - recommended": mean - float(np.mean(fixed)) if fixed else None,
                        "best peer": f"{bar:.4f} {peer}", "margin": mean - bar, "+0.01 met": "yes" if mean >= bar + MARGIN else "no"})  # fmt: skip
    return out


#: The settings whose values the "what each part of the space gave" table compares.
SETTINGS = ("variant", "dropout", "input_dropout", "learning_rate", "weight_decay", "schedule", "epochs")


def parts(trials: list[dict]) -> list[dict]:
    """What each part of the search space gave: per setting and value, the completed trials that
    had it and the best validation mAP@all among them at the top fidelity the search reached (a
    shorter trial's score is not comparable), and at any fidelity."""
    done = [t for t in trials if t["status"] == "ok"]
    top = max((t["units"] for t in done), default=0)
    out = []
    for name in SETTINGS:
        for value in sorted({t[name] for t in done if name in t}, key=str):
            having = [t for t in done if t.get(name) == value]
            full = [t["score"] for t in having if t["units"] == top]
            out.append({"setting": name, "value": value, "trials": len(having), f"best at {top} units": max(full) if full else "",
                        "best at any units": max(t["score"] for t in having)})  # fmt: skip
    return out


def markdown(payload: dict) -> str:
    lines = ["# tfhash.tuning on the peer protocol and Wiki (python -m benchmarks.tuning)", "",
             "The search sees the training rows only (its own validation split: 20% held out, half of them queries, "
             "training rows joining the held-out database to the protocol's share of training rows in its database, "
             "at most 0.9: the `train in database` column); the chosen recipe is then trained on all "
             "training rows and tested on the protocol's queries. The head is the protocol's (one hidden layer of 1024). "
             "The recommended recipe and the best peer: benchmarks/results/peers.json, same protocol; on Wiki the "
             "recommended recipe from benchmarks/results/wiki.json and the published SDMCH values (the head is searched there).", "",
             "## Tuned against the recommended recipe and the best peer (test, mean over seeds)", "",
             markdown_table(cells(payload["tests"]), ["dataset", "metric", "bits", "tuned at", "tuned method", "tuned", "tuned std",
                                                      "seeds", "recommended", "recommended std", "tuned - recommended", "best peer",
                                                      "margin", "+0.01 met"]), "",
             "## The searches (seed 0)", "",
             markdown_table(payload["searches"], ["dataset", "bits", "train in database", "chosen", "validation mAP@all", "trials", "failed",
                                                  "budget multiple", "seconds", "one training seconds", "cost multiple"]), ""]  # fmt: skip
    if payload.get("earlier tries"):
        lines += ["## Earlier tries (superseded settings of the search, kept for what they showed)", "",
                  markdown_table(payload["earlier tries"], ["dataset", "commit", "train in database", "chosen", "validation mAP@all",
                                                            "test", "recommended test", "what it showed"]), ""]  # fmt: skip
    for search in payload["searches"]:
        lines += [f"### {search['dataset']}, {search['bits']} bits: every trial", "", search["table"], ""]
        if search.get("trial rows"):
            by_part = parts(search["trial rows"])
            lines += [f"What each part of the space gave ({search['dataset']}, validation mAP@all):", "",
                      markdown_table(by_part, list(by_part[0])), ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", choices=(*DATASETS, WIKI), default=[*DATASETS, WIKI])
    parser.add_argument("--tune-bits", type=int, default=32, help="the code length each dataset is tuned at")
    parser.add_argument("--tune-each", action="store_true",
                        help="tune at each of --bits instead, and test each code length with the choice made at it")  # fmt: skip
    parser.add_argument("--bits", nargs="+", type=int, default=[16, 32, 64])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--seed", type=int, default=0, help="the search's seed (validation split, Hyperband, trials)")
    parser.add_argument("--max-units", type=positive_int, default=9)
    parser.add_argument("--cache", default="runs/cache", help="where the CIFAR-10 features are kept")
    args = parser.parse_args()
    path = RESULTS_DIR / "tuning.json"
    payload = json.loads(path.read_text()) if path.is_file() else {"searches": [], "tests": []}
    for dataset in args.datasets:
        if dataset == WIKI:  # the benchmark's own head (two layers of 1024 per tower) is part of its recipe: searched
            from benchmarks.wiki import run as wiki_run
            from benchmarks.wiki import wiki_data

            (x, labels), _, _ = wiki_data(args.seed, validation=False)
            kind, space = "cross-modal", SEARCH_SPACES["cross-modal"]
            share = MAX_SHARE  # the protocol's database is the training set

            def test(recipe, bits, seed):
                row = wiki_run(recipe, bits, seed)
                return {"I->T": row["I->T"], "T->I": row["T->I"], "train_s": row["train_s"]}
        else:
            data = load_peer_data(dataset, cache_dir=args.cache)
            kind = KINDS[dataset]
            space = replace(SEARCH_SPACES[kind], hidden=(HIDDEN,))
            x, labels = data.x[data.split.train], data.labels[data.split.train]
            share = min(MAX_SHARE, float(np.isin(data.split.database, data.split.train).mean()))  # the protocol's
            def test(recipe, bits, seed, data=data):
                return test_row(data, recipe, bits, seed)

        payload["searches"] = [s for s in payload["searches"] if s["dataset"] != dataset]
        payload["tests"] = [r for r in payload["tests"] if r["dataset"] != dataset]
        for tune_bits in args.bits if args.tune_each else [args.tune_bits]:
            result = tune(x, labels, tune_bits, seed=args.seed, budget=Budget(max_units=args.max_units), kind=kind, space=space,
                          train_in_database=share)  # fmt: skip
            recipe = result.recipe
            tests = []
            for bits in [tune_bits] if args.tune_each else args.bits:
                for seed in args.seeds:
                    row = {"dataset": dataset, "bits": bits, "seed": seed, "method": recipe.method, "tuned at bits": tune_bits,
                           **test(recipe, bits, seed)}  # fmt: skip
                    print(json.dumps(row), flush=True)
                    tests.append(row)
            # one training of the chosen recipe at the searched bits and seed, for the cost multiple
            same = [r["train_s"] for r in tests if (r["bits"], r["seed"]) == (tune_bits, args.seed)]
            one = same[0] if same else test(recipe, tune_bits, args.seed)["train_s"]
            failed = sum(t["status"] != "ok" for t in result.trials)
            search = {"dataset": dataset, "bits": tune_bits, "seed": args.seed, "train in database": round(share, 3),
                      "chosen": f"{recipe.method} {json.dumps(recipe.options)} lr {recipe.learning_rate} wd {recipe.weight_decay} "
                      f"dropout {recipe.dropout} {recipe.schedule} {recipe.epochs} epochs hidden {json.dumps(recipe.hidden_lists())}",
                      "recipe": asdict(recipe),
                      "validation mAP@all": result.score, "trials": len(result.trials), "failed": failed,
                      "budget multiple": round(result.budget.multiple(), 2), "seconds": result.seconds, "one training seconds": one,
                      "cost multiple": round(result.seconds / one, 1), "table": result.table(), "trial rows": result.trials}  # fmt: skip
            print(json.dumps({k: v for k, v in search.items() if k not in ("table", "trial rows")}), flush=True)
            payload["searches"].append(search)
            payload["tests"] += tests
            write_results("tuning", payload, markdown(payload))


if __name__ == "__main__":
    main()
