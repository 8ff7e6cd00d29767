"""The evidence report: one command, fixed seeds, real data.

    python -m benchmarks.report [--quick] [--seed 0] [--only SECTION ...] [--merge]

Writes ``benchmarks/results/report[_quick].json``, ``report[_quick].md`` and
``report[_quick]_*.png``. ``--quick`` (fewer bit lengths, epochs, sizes and folds) finishes in
under 20 minutes on 2 CPU cores once the CIFAR-10 SqueezeNet features are cached
(``runs/cache/``; computing them once takes about 5 minutes more); the full run takes hours and
is not part of CI.

Sections: single-label retrieval (MNIST, CIFAR-10), multi-label (MIRFlickr-25K), cross-modal
(Wiki), training cost vs n, the transfer protocol (HCLM Sec. 5.3), SCDH sensitivity, index and
metrics speed, the pipeline end to end. The SCDH paper's qualitative claims are checked on the
rows and the verdicts written into the report.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import keras
import numpy as np

from benchmarks import methods, paper_notes, plots
from benchmarks.common import RESULTS_DIR, environment, markdown_table
from tfhash.labels import multi_hot

SECTIONS = ("retrieval", "multilabel", "crossmodal", "cost", "transfer", "sensitivity", "systems", "pipeline")
# The result keys each section writes (``--merge`` carries them over from an earlier run).
SECTION_KEYS = {part: (part,) for part in SECTIONS} | {"cost": ("cost", "cost_slopes"),
                                                      "transfer": ("transfer", "transfer_means")}

SETTINGS = {
    "quick": {
        "bits": [32], "epochs": 20, "mt_unlabelled": 20000,
        "cost_sizes": [1000, 2000, 4000, 8000, 16000, 32000], "cost_epochs": 2,
        "folds": 2, "transfer_bits": 32, "transfer_epochs": 15,
        "sensitivity": {"lam": [0.0, 0.005, 0.1], "mu": [0.0, 0.2, 1.0], "alpha": [0.0, 0.05, 1.0]},
        "sensitivity_epochs": 15,
        "multilabel_bits": [32], "multilabel_epochs": 10, "wiki_bits": [32], "wiki_epochs": 30,
        "index_n": 100_000, "metrics_large": False, "pipeline": {"limit": 2000, "epochs": 3, "map_threshold": 0.5},
    },
    "full": {
        "bits": [16, 32, 48, 64], "epochs": 40, "mt_unlabelled": None,
        "cost_sizes": [1000, 2000, 4000, 8000, 16000, 32000], "cost_epochs": 3,
        "folds": 4, "transfer_bits": 32, "transfer_epochs": 30,
        "sensitivity": {"lam": [0.0, 0.001, 0.005, 0.02, 0.1], "mu": [0.0, 0.05, 0.2, 0.5, 1.0],
                        "alpha": [0.0, 0.01, 0.05, 0.2, 1.0, 4.0]},
        "sensitivity_epochs": 30,
        "multilabel_bits": [16, 32, 64], "multilabel_epochs": 30, "wiki_bits": [16, 32, 64], "wiki_epochs": 100,
        "index_n": 1_000_000, "metrics_large": True, "pipeline": {},
    },
}  # fmt: skip

TRANSFER_METHODS = ("sHCLM", "sHCLM+triplet", "SCDH", "HyP2")
COST_METHODS = ("SCDH", "sHCLM", "DPSH-style pairwise")


def retrieval_rows(data: methods.FeatureData, bits_list, cfg: dict, seed: int) -> list[dict]:
    """Every single-label method at every bit length, standard split. MT-SCDH also sees database
    rows outside the training set, unlabelled (all of them, or ``mt_unlabelled`` sampled), with the
    labelled rows repeated to half of its rows and as many passes over them as the others make."""
    split = data.split
    train, query, db = split.train, split.query, split.database
    rest = np.setdiff1d(db, train)
    if cfg["mt_unlabelled"]:
        rest = np.random.default_rng(seed).choice(rest, cfg["mt_unlabelled"], replace=False)
    rows = []
    for bits in bits_list:
        for name in methods.SINGLE_LABEL_METHODS + methods.MT_VARIANTS:
            mean_teacher = name.startswith("MT-SCDH")
            model, x, y = methods.benchmark_model(name, data.x[train], data.labels[train], bits, seed,
                                               unlabelled=data.x[rest] if mean_teacher else None)  # fmt: skip
            epochs = cfg["epochs"]
            if mean_teacher:  # as many passes over the labelled rows as the other methods make
                epochs = max(1, round(epochs * len(train) / int((y.sum(axis=1) > 0).sum())))
            row = {"dataset": data.name, "method": name, "bits": bits,
                   "unlabelled rows": len(rest) if mean_teacher else 0}  # fmt: skip
            row.update(methods.fit_and_score(model, x, y, data.x[query], data.labels[query], data.x[db],
                                             data.labels[db], epochs, seed))  # fmt: skip
            rows.append(row)
            print(row, flush=True)
    return rows


def cost_rows(data: methods.FeatureData, sizes, epochs: int, seed: int, bits: int = 32) -> list[dict]:
    """Seconds per training epoch against n for the unary losses and the all-pairs baseline; n
    rows are sampled from the database. One untimed epoch first (graph tracing)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        pick = rng.choice(data.split.database, n, replace=False)
        row = {"n": n, "bits": bits, "seed": seed}
        for name in COST_METHODS:
            model, x, y = methods.benchmark_model(name, data.x[pick], data.labels[pick], bits, seed)
            model.compile(optimizer=keras.optimizers.Adam(1e-3))
            model.fit(x, y, epochs=1, batch_size=methods.BATCH, verbose=0)
            start = time.perf_counter()
            model.fit(x, y, epochs=epochs, batch_size=methods.BATCH, verbose=0)
            row[f"{name} s/epoch"] = (time.perf_counter() - start) / epochs
        rows.append(row)
        print(row, flush=True)
    return rows


def log_log_slopes(rows: list[dict]) -> dict:
    """Least-squares slope of log(seconds per epoch) on log(n), over all sizes and over the
    larger half (where fixed per-step overheads matter least)."""
    n = np.log([r["n"] for r in rows])
    slopes = {}
    for name in COST_METHODS:
        t = np.log([r[f"{name} s/epoch"] for r in rows])
        half = min(len(rows) // 2, len(rows) - 2)
        slopes[name] = {"all sizes": round(float(np.polyfit(n, t, 1)[0]), 2),
                        "larger half": round(float(np.polyfit(n[half:], t[half:], 1)[0]), 2)}  # fmt: skip
    return slopes


def class_folds(num_classes: int, folds: int, seed: int, held_share: float = 0.25) -> list[np.ndarray]:
    """Held-out class sets: a seeded permutation of the classes cut into ``round(1 / held_share)``
    groups (sizes 3, 3, 2, 2 for 10 classes: 70-80% of the classes train); the first ``folds``."""
    groups = np.array_split(np.random.default_rng(seed).permutation(num_classes), round(1 / held_share))
    return [np.sort(g) for g in groups[:folds]]


def transfer_rows(data: methods.FeatureData, cfg: dict, seed: int) -> list[dict]:
    """HCLM Sec. 5.3 / Sablayrolles et al.: train on the seen classes' training rows; queries and
    database from the held-out classes only. Scores: retrieval mAP@all among held-out classes and
    the accuracy on the queries of a softmax (logistic) regression fitted on the database codes."""
    from sklearn.linear_model import LogisticRegression

    from tfhash.metrics import evaluate_retrieval

    ids = data.class_ids
    rows = []
    for fold, held in enumerate(class_folds(data.num_classes, cfg["folds"], seed)):
        seen = np.setdiff1d(np.arange(data.num_classes), held)
        train = data.split.train[np.isin(ids[data.split.train], seen)]
        query = data.split.query[np.isin(ids[data.split.query], held)]
        db = data.split.database[np.isin(ids[data.split.database], held)]
        seen_labels = data.labels[train][:, seen]
        for name in TRANSFER_METHODS:
            model, x, y = methods.benchmark_model(name, data.x[train], seen_labels, cfg["transfer_bits"], seed)
            model.compile(optimizer=keras.optimizers.Adam(1e-3))
            start = time.perf_counter()
            model.fit(x, y, epochs=cfg["transfer_epochs"], batch_size=methods.BATCH, verbose=0)
            seconds = time.perf_counter() - start
            query_codes, db_codes = model.encode(data.x[query]), model.encode(data.x[db])
            mean_ap = evaluate_retrieval(query_codes, db_codes, ids[query], ids[db]).mean_average_precision()
            classifier = LogisticRegression(max_iter=2000).fit(db_codes.astype("float32"), ids[db])
            accuracy = float((classifier.predict(query_codes.astype("float32")) == ids[query]).mean())
            row = {"dataset": data.name, "fold": fold, "held-out classes": " ".join(map(str, held)),
                   "method": name, "bits": cfg["transfer_bits"], "mAP@all": mean_ap, "softmax accuracy": accuracy,
                   "train_s": round(seconds, 1), "seed": seed}  # fmt: skip
            rows.append(row)
            print(row, flush=True)
    return rows


def transfer_means(rows: list[dict]) -> list[dict]:
    out = []
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        for name in TRANSFER_METHODS:
            picked = [r for r in rows if r["dataset"] == dataset and r["method"] == name]
            out.append({"dataset": dataset, "method": name, "folds": len(picked),
                        "mean mAP@all": float(np.mean([r["mAP@all"] for r in picked])),
                        "mean softmax accuracy": float(np.mean([r["softmax accuracy"] for r in picked]))})  # fmt: skip
    return out


def sensitivity_rows(data: methods.FeatureData, cfg: dict, seed: int, bits: int = 32) -> list[dict]:
    """SCDH Fig. 8: vary one of lambda, mu, alpha around the CIFAR-10 preset, the others fixed;
    record mAP and the training quantization loss l_q of the last epoch."""
    from tfhash.models import build_scdh, mlp

    split = data.split
    rows = []
    for parameter, values in cfg["sensitivity"].items():
        for value in values:
            keras.utils.set_random_seed(seed)
            model = build_scdh(mlp(data.x.shape[1], methods.HIDDEN), data.num_classes, bits, preset="cifar10",
                               **{parameter: value})  # fmt: skip
            row = {"dataset": data.name, "parameter": parameter, "value": value, "bits": bits}
            row.update(methods.fit_and_score(model, data.x[split.train], multi_hot(data.labels[split.train]),
                                             data.x[split.query], data.labels[split.query], data.x[split.database],
                                             data.labels[split.database], cfg["sensitivity_epochs"], seed))  # fmt: skip
            rows.append(row)
            print(row, flush=True)
    return rows


def multilabel_rows(cfg: dict, seed: int) -> list[dict]:
    from benchmarks import proxy, semantic_cluster

    rows = semantic_cluster.mirflickr_rows(cfg["multilabel_bits"], cfg["multilabel_epochs"], seed, anchors=None)
    rows += proxy.mirflickr_rows(seed, cfg["multilabel_bits"], cfg["multilabel_epochs"])
    return sorted(rows, key=lambda r: r["bits"])


def crossmodal_rows(cfg: dict, seed: int) -> list[dict]:
    """JCCH on Wiki with the paper-like recipe (one 512-unit layer, learned centres) for
    ``wiki_epochs``; tfhash's recommended recipe is in ``benchmarks/results/wiki.md``."""
    import dataclasses

    from benchmarks import wiki
    from tfhash.recipes import PAPER_LIKE

    recipe = dataclasses.replace(PAPER_LIKE["cross-modal"], epochs=cfg["wiki_epochs"])
    rows = []
    for bits in cfg["wiki_bits"]:
        row = wiki.run(recipe, bits, seed)
        rows.append({"method": "JCCH", "bits": bits, "I->T mAP@all": row["I->T"], "T->I mAP@all": row["T->I"],
                     "train_s": row["train_s"], "seed": seed})  # fmt: skip
    return rows


def systems_rows(cfg: dict, seed: int) -> dict:
    from benchmarks import index, metrics

    metrics.compile_kernels()
    metric_rows = [metrics.run_case("CIFAR-10 protocol", 1000, 59000, 64, seed)]
    if cfg["metrics_large"]:
        metric_rows.append(metrics.run_case("large", 10000, 1_000_000, 64, seed, naive_queries=100))
    return {"index": index.run(cfg["index_n"], 64, seed, 1000, 20), "metrics": metric_rows}


def pipeline_row(overrides: dict, seed: int) -> dict:
    """The main job's pipeline (pipelines/configs/mnist.json) in a fresh run directory, timed;
    ``overrides`` shrink it (examples per split, epochs) for the quick report."""
    from tfhash.pipelines.config import PipelineConfig
    from tfhash.pipelines.runner import run_local

    shipped = Path(__file__).resolve().parents[1] / "pipelines" / "configs" / "mnist.json"
    raw = json.loads(shipped.read_text())
    with tempfile.TemporaryDirectory(prefix="tfhash-report-") as tmp:
        raw.update(run_dir=str(Path(tmp) / "run"), split_seed=seed)
        raw.update({k: v for k, v in overrides.items() if k in ("limit", "map_threshold")})
        raw["training"].update({k: v for k, v in overrides.items() if k == "epochs"}, seed=seed)
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(raw))
        start = time.perf_counter()
        summary = run_local(PipelineConfig.load(path), log=lambda *_: None)
        seconds = time.perf_counter() - start
    metrics_ = summary.get("metrics") or {}
    return {"config": "pipelines/configs/mnist.json", "examples per split": raw.get("limit") or "all",
            "epochs": raw["training"]["epochs"], "bits": raw["training"]["bits"], "wall_s": round(seconds, 1),
            "mAP@all": metrics_.get("mAP@all"), "P@H<=2": metrics_.get("P@H<=2"), "blessed": summary.get("blessed"),
            "seed": seed}  # fmt: skip


def check_claims(results: dict) -> list[dict]:
    """The SCDH paper's qualitative claims, decided on our rows (a claim 'holds' only where every
    compared pair agrees), and its alpha rule of thumb."""
    claims = []
    retrieval = results.get("retrieval", [])

    def compare(better: str, worse: str, claim: str):
        pairs = []
        for row in retrieval:
            if row["method"] != better:
                continue
            other = next((r for r in retrieval if r["method"] == worse and r["dataset"] == row["dataset"]
                          and r["bits"] == row["bits"]), None)  # fmt: skip
            if other is not None:
                pairs.append(f"{row['dataset']} {row['bits']} bits: {row['mAP@all']:.4f} vs {other['mAP@all']:.4f}")
                pairs[-1] += "" if row["mAP@all"] > other["mAP@all"] else " (fails)"
        if pairs:
            holds = not any(p.endswith("(fails)") for p in pairs)
            claims.append({"claim": claim, "holds": holds, "evidence": "; ".join(pairs)})

    compare("SCDH", "SCDH-S", "SCDH beats its ablation SCDH-S (mAP@all)")
    compare("MT-SCDH", "SCDH", "MT-SCDH beats SCDH when most of the database is unlabelled (mAP@all)")
    compare("MT-SCDH", "MT-SCDH w=0", "MT-SCDH's consistency term (w = 50) helps over the same teacher without it (w = 0)")
    if "cost_slopes" in results:
        slopes = results["cost_slopes"]
        unary = [slopes[m]["larger half"] for m in ("SCDH", "sHCLM")]
        pairwise = slopes["DPSH-style pairwise"]["larger half"]
        linear = all(0.7 <= s <= 1.3 for s in unary)
        faster = all(pairwise > s + 0.2 for s in unary)
        claims.append({
            "claim": "unary losses' epoch time grows linearly in n, the all-pairs loss's faster",
            "holds": linear and faster,
            "evidence": f"log-log slopes over the larger half of n: SCDH {unary[0]}, sHCLM {unary[1]}, "
                        f"pairwise {pairwise} (linear = slope in [0.7, 1.3]; faster = at least 0.2 above)",
        })  # fmt: skip
    alpha_rows = [r for r in results.get("sensitivity", []) if r["parameter"] == "alpha" and "final l_q" in r]
    if alpha_rows:
        best = max(alpha_rows, key=lambda r: r["mAP@all"])
        in_band = [r["value"] for r in alpha_rows if 0.1 <= r["final l_q"] <= 0.2]
        claims.append({
            "claim": "rule of thumb: the alpha whose training l_q ends in 0.1-0.2 retrieves best",
            "holds": best["value"] in in_band,
            "evidence": "; ".join(f"alpha {r['value']:g}: l_q {r['final l_q']:.3f}, mAP {r['mAP@all']:.4f}" for r in alpha_rows),
        })  # fmt: skip
    return claims


def settings_rows() -> dict:
    """tfhash's own settings beside the papers' (the rows above keep the papers' settings, e.g.
    MT-SCDH at w = 50, because they test the papers' claims): from the benchmarks' result files,
    the recommended recipes' margins over the best peer and MT-SCDH with
    :data:`tfhash.recipes.MEAN_TEACHER` against SCDH (``benchmarks.peers``), and the tuned recipes
    (``benchmarks.tuning``). Empty parts when a file is missing."""
    from benchmarks import peers

    out = {}
    path = RESULTS_DIR / "peers.json"
    if path.is_file():
        rows = json.loads(path.read_text())["rows"]
        out["recommended"] = [r for r in peers.margins(rows) if r["recipe"] == "recommended"]
        out["semi-supervised"] = [r for r in peers.semi_supervised(rows) if r["MT-SCDH label"] == "semi-supervised"]
    path = RESULTS_DIR / "tuning.json"
    if path.is_file():
        from benchmarks.tuning import cells

        out["tuned"] = cells(json.loads(path.read_text())["tests"])
    return out


def settings_claims(settings: dict) -> list[dict]:
    """The claim the papers' settings fail here, decided again with tfhash's settings."""
    rows = settings.get("semi-supervised") or []
    if not rows:
        return []
    evidence = "; ".join(f"{r['dataset']} {r['bits']} bits: {r['MT-SCDH']:.4f} vs {r['SCDH']:.4f} ({r['seeds']} seeds)"
                         + ("" if r["gain"] > 0 else " (fails)") for r in rows)  # fmt: skip
    return [{"claim": "MT-SCDH beats SCDH when most of the database is unlabelled, with tfhash.recipes.MEAN_TEACHER "
                      "(benchmarks.peers --semi-supervised, means over seeds)",
             "holds": all(r["gain"] > 0 for r in rows), "evidence": evidence}]  # fmt: skip


RETRIEVAL_COLUMNS = ["method", "bits", "mAP@all", "P@H<=2", "P@1000", "train_s", "epochs", "unlabelled rows", "seed"]


def provenance(results: dict, command: str) -> str:
    """The report's first paragraph: how to regenerate it, the machine, and when each part ran."""
    env = results["environment"]
    text = (f"Regenerate: `{command}` (seed {results['seed']}, mode **{results['mode']}**). "
            f"Machine: {env['cpus']} CPUs, Python {env['python']}, TensorFlow {env.get('tensorflow')}")  # fmt: skip
    if "section_runs" not in results:
        return text + f"; date {env['date']}; total {results['total_s'] / 60:.1f} min. All numbers below come from this run.\n"
    runs = "; ".join(f"{part} {run['date']} ({run['seconds'] / 60:.1f} min)" for part, run in results["section_runs"].items())
    return (text + ". The sections were run separately and merged (`--merge`), same seed and settings: "
            + runs + f"; total {results['total_s'] / 60:.1f} min.\n")  # fmt: skip


def markdown(results: dict, command: str) -> str:
    """The report text: settings, claims, one section per part with the paper's closest setting."""
    notes = paper_notes.NOTES
    md = [
        "# tfhash evidence report\n",
        provenance(results, command),
        "Every retrieval model trains the same head (one hidden layer of 512, dropout 0.2, Adam 1e-3, batch 128) "
        "on fixed inputs: MNIST raw pixels; CIFAR-10 frozen ImageNet SqueezeNet v1.1 features (the papers fine-tune "
        "AlexNet / VGG / ResNet end to end, which neither the weights nor the 2-core CPU budget allow here). "
        "Nothing is fine-tuned; that is the main reason our CIFAR-10 numbers sit far below the papers'.\n",
        f"Settings: `{json.dumps(results['settings'])}`\n",
    ]
    if results.get("claims"):
        md += ["## The SCDH paper's claims on our data\n",
               markdown_table([{**c, "holds": "yes" if c["holds"] else "**no**"} for c in results["claims"]],
                              ["claim", "holds", "evidence"]), ""]  # fmt: skip
    if "retrieval" in results:
        md += ["## Single-label retrieval (standard split: 100 queries per class, the rest database, 500 per class "
               "train; MT-SCDH adds unlabelled database rows)\n", notes["retrieval"], ""]
        for dataset in dict.fromkeys(r["dataset"] for r in results["retrieval"]):
            md += [f"### {dataset}\n", markdown_table([r for r in results["retrieval"] if r["dataset"] == dataset],
                                                     RETRIEVAL_COLUMNS), "",
                   f"![{dataset} mAP](report{results['suffix']}_retrieval_{dataset.lower()}.png)\n"]  # fmt: skip
    if "multilabel" in results:
        md += ["## Multi-label: MIRFlickr-25K, tags -> codes (2,000 queries / 18,015 database / 10,000 train; "
               "relevant = shares a label)\n", notes["multilabel"], "",
               markdown_table(results["multilabel"], ["method", "bits", "mAP@all", "P@H<=2", "P@1000", "train_s", "epochs", "seed"]), ""]  # fmt: skip
    if "crossmodal" in results:
        md += ["## Cross-modal: Wiki, JCCH (693 query pairs, 2,173 database / training pairs)\n", notes["crossmodal"], "",
               markdown_table(results["crossmodal"], ["method", "bits", "I->T mAP@all", "T->I mAP@all", "train_s", "seed"]), ""]  # fmt: skip
    if "cost" in results:
        slopes = results["cost_slopes"]
        md += ["## Training cost vs n (CIFAR-10 features, 32 bits, seconds per epoch after one untimed epoch)\n",
               notes["cost"], "", markdown_table(results["cost"], ["n", *[f"{m} s/epoch" for m in COST_METHODS]]), "",
               "Log-log slopes: " + "; ".join(f"{m}: {v['all sizes']} (all n), {v['larger half']} (larger half)"
                                              for m, v in slopes.items()) + "\n",
               f"![cost](report{results['suffix']}_cost.png)\n"]  # fmt: skip
    if "transfer" in results:
        md += ["## Transfer to held-out classes (HCLM Sec. 5.3, Sablayrolles et al.)\n", notes["transfer"], "",
               markdown_table(results["transfer_means"], ["dataset", "method", "folds", "mean mAP@all", "mean softmax accuracy"]), "",
               "Per fold:\n",
               markdown_table(results["transfer"], ["dataset", "fold", "held-out classes", "method", "bits", "mAP@all",
                                                    "softmax accuracy", "train_s", "seed"]), "",
               f"![transfer](report{results['suffix']}_transfer.png)\n"]  # fmt: skip
    if "sensitivity" in results:
        md += ["## SCDH sensitivity to lambda, mu, alpha (CIFAR-10 features, 32 bits; SCDH Fig. 8)\n", notes["sensitivity"], "",
               markdown_table(results["sensitivity"], ["parameter", "value", "mAP@all", "P@H<=2", "final l_q", "train_s", "seed"]), "",
               f"![sensitivity](report{results['suffix']}_sensitivity.png)\n"]  # fmt: skip
    if "systems" in results:
        md += ["## Index and metrics speed\n", notes["systems"], "",
               markdown_table(results["systems"]["index"], ["n", "bits", "index", "exact", "k", "build_s", "memory_MiB",
                                                            "query_ms", "recall@k"]), "",
               markdown_table(results["systems"]["metrics"], ["case", "queries", "database", "bits", "fast_s", "naive_s",
                                                              "naive_queries_timed", "speed-up", "same mAP on timed queries"]), ""]  # fmt: skip
    if "pipeline" in results:
        md += ["## Pipeline end to end (LocalDagRunner, fresh run directory)\n", notes["pipeline"], "",
               markdown_table([results["pipeline"]], list(results["pipeline"].keys())), ""]
    settings = results.get("settings_rows") or {}
    if any(settings.values()):
        md += ["## With tfhash's recommended and tuned settings (from the benchmarks' result files)\n",
               "The rows above keep the papers' settings, since they test the papers' claims. These rows use the settings "
               "tfhash ships (`tfhash.recipes`, chosen on validation splits) or chooses (`tfhash.tuning`) on the peer "
               "protocol, means over seeds 0-2.\n"]  # fmt: skip
        if settings.get("semi-supervised"):
            md += ["MT-SCDH with `tfhash.recipes.MEAN_TEACHER` against SCDH (`python -m benchmarks.peers --semi-supervised`):\n",
                   markdown_table(settings["semi-supervised"], ["dataset", "bits", "seeds", "MT-SCDH", "SCDH", "gain", "gain std"]), ""]  # fmt: skip
        if settings.get("recommended"):
            md += ["The recommended recipes against the best peer (`python -m benchmarks.peers --recommended`):\n",
                   markdown_table(settings["recommended"], ["dataset", "metric", "bits", "best tfhash", "mean", "std", "best peer",
                                                            "margin", "+0.01 met"]), ""]  # fmt: skip
        if settings.get("tuned"):
            md += ["The tuned recipes (`python -m benchmarks.tuning`):\n",
                   markdown_table(settings["tuned"], ["dataset", "metric", "bits", "tuned method", "tuned", "tuned std", "recommended",
                                                      "tuned - recommended", "best peer", "margin", "+0.01 met"]), ""]  # fmt: skip
    return "\n".join(md)


def regenerate_command(quick: bool, seed: int, sections: list[str]) -> str:
    """The command line that reruns a report of these sections (all of them when ``sections`` is empty)."""
    return ("python -m benchmarks.report" + (" --quick" if quick else "") + f" --seed {seed}"
            + "".join(f" --only {part}" for part in sections))  # fmt: skip


def load_report(path: Path, new: dict) -> dict:
    """The earlier report that ``--merge`` extends; refused unless its seed, mode and settings match."""
    if not path.exists():
        return {"seed": new["seed"], "mode": new["mode"], "settings": new["settings"], "sections": []}
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"--merge: cannot read {path}: {err}") from None
    for key in ("seed", "mode", "settings"):
        if json.dumps(old.get(key), sort_keys=True) != json.dumps(new[key], sort_keys=True, default=float):
            raise SystemExit(f"--merge: {path} has a different {key} ({old.get(key)!r}); run without --merge")
    return old


def merged(old: dict, new: dict) -> dict:
    """``new`` plus the sections of ``old`` it did not rerun, with each section's date and seconds."""
    runs = old.get("section_runs") or {part: {"date": old["environment"]["date"], "seconds": old["section_s"][part]}
                                       for part in old["sections"]}  # fmt: skip
    runs = {part: run for part, run in runs.items() if part not in new["sections"]}
    runs |= {part: {"date": new["environment"]["date"], "seconds": new["section_s"][part]} for part in new["sections"]}
    out = dict(new)
    for part in old["sections"]:
        if part not in new["sections"]:
            out.update({key: old[key] for key in SECTION_KEYS[part] if key in old})
    out["sections"] = [part for part in SECTIONS if part in runs]
    out["section_runs"] = {part: runs[part] for part in out["sections"]}
    out["section_s"] = {part: run["seconds"] for part, run in out["section_runs"].items()}
    out["total_s"] = sum(out["section_s"].values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the smaller run (under 20 minutes with cached features)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=SECTIONS, action="append", help="run only these sections (repeatable)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other sections of the existing report of this mode (same seed and settings)")
    parser.add_argument("--render", action="store_true",
                        help="train nothing: rewrite the existing report of this mode with the benchmarks' current "
                             "recommended / tuned rows and the claims decided again")  # fmt: skip
    args = parser.parse_args()
    mode = "quick" if args.quick else "full"
    cfg = SETTINGS[mode]
    parts = args.only or list(SECTIONS)
    suffix = "_quick" if args.quick else ""
    if args.render:
        results = json.loads((RESULTS_DIR / f"report{suffix}.json").read_text())
        whole = results["sections"] == list(SECTIONS)
        write_report(results, regenerate_command(args.quick, results["seed"], [] if whole else results["sections"]), suffix,
                     plot=False)  # fmt: skip
        return
    results: dict = {"seed": args.seed, "mode": mode, "suffix": suffix, "settings": cfg, "sections": parts}
    start = time.perf_counter()
    timings = {}
    datasets = {}

    def data(name):
        if name not in datasets:
            datasets[name] = methods.mnist_pixels(args.seed) if name == "MNIST" else methods.cifar_squeezenet(args.seed)
        return datasets[name]

    for part in parts:
        began = time.perf_counter()
        print(f"== {part}", flush=True)
        if part == "retrieval":
            results["retrieval"] = [r for name in ("MNIST", "CIFAR-10") for r in retrieval_rows(data(name), cfg["bits"], cfg, args.seed)]
        elif part == "multilabel":
            results["multilabel"] = multilabel_rows(cfg, args.seed)
        elif part == "crossmodal":
            results["crossmodal"] = crossmodal_rows(cfg, args.seed)
        elif part == "cost":
            results["cost"] = cost_rows(data("CIFAR-10"), cfg["cost_sizes"], cfg["cost_epochs"], args.seed)
            results["cost_slopes"] = log_log_slopes(results["cost"])
        elif part == "transfer":
            results["transfer"] = [r for name in ("CIFAR-10", "MNIST") for r in transfer_rows(data(name), cfg, args.seed)]
            results["transfer_means"] = transfer_means(results["transfer"])
        elif part == "sensitivity":
            results["sensitivity"] = sensitivity_rows(data("CIFAR-10"), cfg, args.seed)
        elif part == "systems":
            results["systems"] = systems_rows(cfg, args.seed)
        elif part == "pipeline":
            results["pipeline"] = pipeline_row(cfg["pipeline"], args.seed)
        timings[part] = round(time.perf_counter() - began, 1)
    results["section_s"] = timings
    results["total_s"] = time.perf_counter() - start
    results["environment"] = environment()
    if args.merge:
        results = merged(load_report(RESULTS_DIR / f"report{suffix}.json", results), results)
    whole = results["sections"] == list(SECTIONS)
    command = regenerate_command(args.quick, args.seed, [] if whole else results["sections"])
    write_report(results, command, suffix)


def write_report(results: dict, command: str, suffix: str, plot: bool = True) -> None:
    """Decide the claims, add tfhash's own settings' rows and write the report's JSON, text and plots."""
    results["settings_rows"] = settings_rows()
    results["claims"] = check_claims(results) + settings_claims(results["settings_rows"])
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    images = plots.write_plots(results, RESULTS_DIR / f"report{suffix}") if plot else []
    (RESULTS_DIR / f"report{suffix}.json").write_text(json.dumps(results, indent=2, default=float))
    (RESULTS_DIR / f"report{suffix}.md").write_text(markdown(results, command))
    print(f"wrote {RESULTS_DIR}/report{suffix}.json, .md and {len(images)} plots in {results['total_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
