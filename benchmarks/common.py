"""Shared helpers of the benchmark scripts: environment record and results files."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from tfhash.precision import cpu_flags

CHECKOUT = Path(__file__).resolve().parents[1]
RESULTS_DIR = CHECKOUT / "benchmarks" / "results"


def positive_int(text: str) -> int:
    """An argparse type: a positive integer."""
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor string elsewhere): machines
    of one kind differ (AMD EPYC, Intel Xeon), and so do their timings."""
    try:
        with open("/proc/cpuinfo") as handle:
            return next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor()


def cpu_description() -> str:
    """The CPU's name and the vector extensions that set its speed class on these machines."""
    flags = cpu_flags()
    extensions = [name for flag, name in (("amx_bf16", "AMX-BF16"), ("avx512f", "AVX-512"), ("avx512_bf16", "AVX512_BF16"))
                  if flag in flags] or (["AVX2 only"] if "avx2" in flags else [])  # fmt: skip
    return f"{cpu_model()} ({', '.join(extensions)})" if extensions else cpu_model()


def checkout_commit(checkout: str | os.PathLike = CHECKOUT) -> str:
    """The short commit of a checkout (this one by default), ``+changes`` when its tracked files
    differ from it; ``"unknown"`` outside git."""
    import subprocess

    try:
        commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(checkout), "diff", "--quiet", "HEAD", "--"], check=False).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+changes" if dirty else "")


def environment() -> dict:
    info = {
        "commit": checkout_commit(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu": cpu_description(),
        "numpy": np.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    try:
        import tensorflow as tf

        info["tensorflow"] = tf.__version__
    except ImportError:
        pass
    return info


def run_line(env: dict) -> str:
    """The line every results page ends with: the code, the machine and the time of its run."""
    return (f"Run at commit {env.get('commit', 'unknown')} on {env.get('cpu') or 'an unrecorded CPU'} "
            f"({env.get('cpus', '?')} CPUs), {env.get('date', 'at an unrecorded time')}; Python {env.get('python', '?')}"
            + (f", TensorFlow {env['tensorflow']}" if "tensorflow" in env else "") + ".")  # fmt: skip


def write_results(name: str, payload: dict, markdown: str) -> Path:
    """Write ``results/<name>.json`` (payload + environment) and ``results/<name>.md`` (ending with
    :func:`run_line`)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    env = environment()
    payload = {"environment": env, **payload}
    json_path = RESULTS_DIR / f"{name}.json"
    json_path.write_text(json.dumps(payload, indent=2, default=float))
    (RESULTS_DIR / f"{name}.md").write_text(markdown.rstrip("\n") + "\n\n" + run_line(env) + "\n")
    print(f"wrote {json_path} and {name}.md")
    return json_path


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    # A column whose floats were all rounded to one decimal (seconds, MiB) prints one decimal; others four.
    short = {c for c in columns
             if all(round(r[c], 1) == r[c] for r in rows if isinstance(r.get(c), float))}  # fmt: skip

    def fmt(column, value):
        if isinstance(value, float):
            return f"{value:.1f}" if column in short else f"{value:.4f}"
        return str(value).replace("|", "\\|")  # a bare | would split the cell

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(c, row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def clustered_packed(n: int, centres: np.ndarray, rng, chunk: int = 1_000_000) -> np.ndarray:
    """``n`` random-but-clustered packed codes: each a random one of ``centres`` with every bit
    flipped with probability 1/8 (drawn from ``rng``, ``chunk`` rows at a time)."""
    out = np.empty((n, centres.shape[1]), dtype=np.uint8)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        shape = (stop - start, centres.shape[1])
        flips = rng.integers(0, 256, shape, dtype=np.uint8) & rng.integers(0, 256, shape, dtype=np.uint8)
        flips &= rng.integers(0, 256, shape, dtype=np.uint8)  # each bit set with probability 1/8
        out[start:stop] = centres[rng.integers(0, len(centres), stop - start)] ^ flips
    return out
