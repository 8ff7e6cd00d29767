"""The evidence report's own logic: class folds, slopes, claim verdicts, the text and the plots.
(The report's numbers come from `python -m benchmarks.report`, not from tests.)"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import methods, plots, report
from benchmarks.common import markdown_table


def test_class_folds_are_disjoint_seeded_and_hold_out_about_a_quarter():
    folds = report.class_folds(10, 4, seed=0)
    assert [len(f) for f in folds] == [3, 3, 2, 2]
    assert sorted(np.concatenate(folds).tolist()) == list(range(10))
    assert all(np.array_equal(a, b) for a, b in zip(folds, report.class_folds(10, 4, seed=0), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(folds, report.class_folds(10, 4, seed=1), strict=True))
    assert len(report.class_folds(10, 2, seed=0)) == 2


def test_markdown_table_keeps_cells_apart_and_prints_rounded_seconds_as_rounded():
    rows = [{"method": "SCUL (q = 1/|Y|)", "mAP": 0.5, "train_s": 16.4, "epochs": 40},
            {"method": "HyP2", "mAP": 0.73126, "train_s": 7.0, "epochs": 40}]  # fmt: skip
    lines = markdown_table(rows, ["method", "mAP", "train_s", "epochs"]).splitlines()
    assert lines[2] == "| SCUL (q = 1/\\|Y\\|) | 0.5000 | 16.4 | 40 |"
    assert lines[3] == "| HyP2 | 0.7313 | 7.0 | 40 |"
    assert all(line.replace("\\|", "").count("|") == 5 for line in lines)


def cost_rows(exponents: dict) -> list[dict]:
    sizes = [1000, 2000, 4000, 8000]
    return [{"n": n, **{f"{m} s/epoch": 1e-3 * n**e for m, e in exponents.items()}} for n in sizes]


def test_log_log_slopes_recover_the_exponents():
    slopes = report.log_log_slopes(cost_rows({"SCDH": 1.0, "sHCLM": 1.1, "DPSH-style pairwise": 2.0}))
    assert slopes["SCDH"]["all sizes"] == pytest.approx(1.0, abs=0.01)
    assert slopes["DPSH-style pairwise"]["larger half"] == pytest.approx(2.0, abs=0.01)


def retrieval(method, bits, value, dataset="MNIST"):
    return {"dataset": dataset, "method": method, "bits": bits, "mAP@all": value}


def test_claims_hold_only_when_every_pair_agrees():
    results = {
        "retrieval": [retrieval("SCDH", 32, 0.9), retrieval("SCDH-S", 32, 0.8), retrieval("SCDH", 64, 0.7),
                      retrieval("SCDH-S", 64, 0.75), retrieval("MT-SCDH", 32, 0.95)],
        "cost_slopes": report.log_log_slopes(cost_rows({"SCDH": 1.0, "sHCLM": 1.0, "DPSH-style pairwise": 1.9})),
    }  # fmt: skip
    claims = {c["claim"].split()[0]: c for c in report.check_claims(results)}
    assert not claims["SCDH"]["holds"] and "64 bits: 0.7000 vs 0.7500 (fails)" in claims["SCDH"]["evidence"]
    assert claims["MT-SCDH"]["holds"]
    assert claims["unary"]["holds"]
    results["cost_slopes"] = report.log_log_slopes(cost_rows({"SCDH": 1.0, "sHCLM": 1.0, "DPSH-style pairwise": 1.1}))
    assert not {c["claim"].split()[0]: c for c in report.check_claims(results)}["unary"]["holds"]


def test_alpha_rule_of_thumb_verdict():
    def row(alpha, lq, value):
        return {"parameter": "alpha", "value": alpha, "final l_q": lq, "mAP@all": value}

    holds = report.check_claims({"sensitivity": [row(0.05, 0.26, 0.50), row(1.0, 0.17, 0.55)]})
    fails = report.check_claims({"sensitivity": [row(0.05, 0.26, 0.56), row(1.0, 0.17, 0.55)]})
    assert holds[0]["holds"] and not fails[0]["holds"]
    assert "alpha 1: l_q 0.170, mAP 0.5500" in holds[0]["evidence"]


def test_markdown_and_plots_from_rows(tmp_path):
    rows = [dict(retrieval(m, b, 0.6 - 0.01 * i), **{"P@H<=2": 0.5, "P@1000": 0.5, "train_s": 1.0, "seed": 0})
            for i, m in enumerate(("SCDH", "SCDH-S")) for b in (16, 32)]  # fmt: skip
    transfer = [{"dataset": "MNIST", "fold": 0, "held-out classes": "1 2", "method": m, "bits": 32, "mAP@all": 0.4,
                 "softmax accuracy": 0.8, "train_s": 1.0, "seed": 0} for m in report.TRANSFER_METHODS]  # fmt: skip
    sensitivity = [{"dataset": "CIFAR-10", "parameter": p, "value": v, "mAP@all": 0.5, "final l_q": 0.2}
                   for p in ("lam", "alpha") for v in (0.0, 0.1)]  # fmt: skip
    results = {"seed": 0, "mode": "quick", "suffix": "_t", "settings": {}, "total_s": 60.0,
               "environment": {"cpus": 2, "python": "3.10", "date": "today"}, "retrieval": rows,
               "cost": cost_rows({"SCDH": 1.0, "sHCLM": 1.0, "DPSH-style pairwise": 2.0}),
               "transfer": transfer, "transfer_means": report.transfer_means(transfer), "sensitivity": sensitivity}  # fmt: skip
    results["cost_slopes"] = report.log_log_slopes(results["cost"])
    results["claims"] = report.check_claims(results)
    written = plots.write_plots(results, tmp_path / "report_t")
    assert sorted(p.name for p in written) == ["report_t_cost.png", "report_t_retrieval_mnist.png",
                                               "report_t_sensitivity.png", "report_t_transfer.png"]  # fmt: skip
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
    text = report.markdown(results, "python -m benchmarks.report --quick --seed 0")
    for needle in ("python -m benchmarks.report --quick --seed 0", "| SCDH beats its ablation SCDH-S (mAP@all) | yes |",
                   "### MNIST", "report_t_cost.png", "Paper setting", "held-out classes"):  # fmt: skip
        assert needle in text


def test_unknown_method_is_refused():
    x, y = np.zeros((4, 3), "float32"), np.eye(2, dtype="float32")[[0, 1, 0, 1]]
    with pytest.raises(ValueError, match="unknown method"):
        methods.benchmark_model("DSH", x, y, 16, 0)
    with pytest.raises(ValueError, match="SCDH trains on labelled rows only"):
        methods.benchmark_model("SCDH", x, y, 16, 0, unlabelled=x)
    _, fit_x, _ = methods.benchmark_model("MT-SCDH", x, y, 16, 0)  # without unlabelled rows: the labelled rows alone
    assert fit_x is x
    with pytest.raises(ValueError, match="must be a number"):
        methods.benchmark_model("MT-SCDH w=high", x, y, 16, 0, unlabelled=x)


def run_of(sections: list[str], date: str, **values) -> dict:
    return {"seed": 0, "mode": "full", "settings": {"bits": [16, 32]}, "sections": sections,
            "section_s": {part: 60.0 for part in sections}, "environment": {"date": date}, **values}  # fmt: skip


def test_merge_keeps_the_sections_it_did_not_rerun_and_replaces_those_it_did():
    first = run_of(["retrieval", "cost"], "day 1", retrieval=["old rows"], cost=["old cost"], cost_slopes={"a": 1})
    second = run_of(["cost", "sensitivity"], "day 2", cost=["new cost"], cost_slopes={"a": 2}, sensitivity=["s"])
    out = report.merged(first, second)
    assert out["sections"] == ["retrieval", "cost", "sensitivity"]
    assert out["retrieval"] == ["old rows"] and out["cost"] == ["new cost"] and out["cost_slopes"] == {"a": 2}
    assert out["section_runs"]["retrieval"]["date"] == "day 1" and out["section_runs"]["cost"]["date"] == "day 2"
    assert out["total_s"] == 180.0
    assert report.merged(out, run_of(["pipeline"], "day 3", pipeline={}))["section_runs"]["cost"]["date"] == "day 2"


def test_merge_refuses_a_report_of_other_settings_or_an_unreadable_one(tmp_path):
    path = tmp_path / "report.json"
    new = run_of(["cost"], "day 2")
    assert report.load_report(path, new)["sections"] == []
    path.write_text(report.json.dumps(run_of(["retrieval"], "day 1") | {"seed": 1}))
    with pytest.raises(SystemExit, match="different seed"):
        report.load_report(path, new)
    path.write_text('{"seed": 0, "mode"')
    with pytest.raises(SystemExit, match="cannot read"):
        report.load_report(path, new)
    path.write_text(report.json.dumps(run_of(["retrieval"], "day 1")))
    assert report.load_report(path, new)["sections"] == ["retrieval"]
