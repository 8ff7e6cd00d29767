"""PNG figures of the evidence report (matplotlib, Agg backend; no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def grouped_bars(ax, groups: list[str], series: dict[str, list[float]], ylabel: str) -> None:
    """One bar per (group, series), groups side by side."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(np.arange(len(groups)) + i * width, values, width, label=name)
    ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, groups, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)


def retrieval_plot(rows: list[dict], dataset: str, path: Path) -> Path:
    picked = [r for r in rows if r["dataset"] == dataset]
    methods = list(dict.fromkeys(r["method"] for r in picked))
    bits = sorted({r["bits"] for r in picked})
    series = {f"{b} bits": [next(r["mAP@all"] for r in picked if r["method"] == m and r["bits"] == b) for m in methods]
              for b in bits}  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 4))
    grouped_bars(ax, methods, series, "mAP@all")
    ax.set_title(f"{dataset}: mAP@all per method")
    return _save(fig, path)


def cost_plot(rows: list[dict], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5, 4))
    n = [r["n"] for r in rows]
    for key in [k for k in rows[0] if k.endswith("s/epoch")]:
        ax.loglog(n, [r[key] for r in rows], marker="o", label=key.replace(" s/epoch", ""))
    ax.set_xlabel("training examples n")
    ax.set_ylabel("seconds per epoch")
    ax.set_title("Training cost vs n (log-log)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def transfer_plot(means: list[dict], path: Path) -> Path:
    datasets = list(dict.fromkeys(r["dataset"] for r in means))
    methods = list(dict.fromkeys(r["method"] for r in means))
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, key in zip(axes, ("mean mAP@all", "mean softmax accuracy"), strict=True):
        series = {d: [next(r[key] for r in means if r["dataset"] == d and r["method"] == m) for m in methods]
                  for d in datasets}  # fmt: skip
        grouped_bars(ax, methods, series, key)
    fig.suptitle("Held-out classes (mean over folds)")
    return _save(fig, path)


def sensitivity_plot(rows: list[dict], path: Path) -> Path:
    parameters = list(dict.fromkeys(r["parameter"] for r in rows))
    fig, axes = plt.subplots(1, len(parameters), figsize=(4 * len(parameters), 3.5), squeeze=False)
    for ax, parameter in zip(axes[0], parameters, strict=True):
        picked = [r for r in rows if r["parameter"] == parameter]
        positions = np.arange(len(picked))
        ax.plot(positions, [r["mAP@all"] for r in picked], marker="o", label="mAP@all")
        ax.plot(positions, [r.get("final l_q", np.nan) for r in picked], marker="s", label="final training l_q")
        ax.set_xticks(positions, [f"{r['value']:g}" for r in picked])
        ax.set_xlabel(parameter)
        ax.legend(fontsize=7)
    fig.suptitle("SCDH sensitivity (one parameter varied, the others at the CIFAR-10 preset)")
    return _save(fig, path)


def write_plots(results: dict, prefix: Path) -> list[Path]:
    """Every figure the present sections allow; file names ``<prefix>_<figure>.png``."""
    written = []
    for dataset in dict.fromkeys(r["dataset"] for r in results.get("retrieval", [])):
        written.append(retrieval_plot(results["retrieval"], dataset, Path(f"{prefix}_retrieval_{dataset.lower()}.png")))
    if results.get("cost"):
        written.append(cost_plot(results["cost"], Path(f"{prefix}_cost.png")))
    if results.get("transfer_means"):
        written.append(transfer_plot(results["transfer_means"], Path(f"{prefix}_transfer.png")))
    if results.get("sensitivity"):
        written.append(sensitivity_plot(results["sensitivity"], Path(f"{prefix}_sensitivity.png")))
    return written
