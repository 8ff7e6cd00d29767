"""The test suite's own cost and reach: per-test durations and line / branch coverage of a run,
recorded under a label, and the table of every recorded run side by side.

    bash scripts/run_tests.sh --durations=0 | tee suite.log            # any tier, any machine
    bash scripts/run_tests.sh --coverage ...                           # writes coverage.json
    python -m benchmarks.test_suite record after --log suite.log [--wall 1234]
    python -m benchmarks.test_suite record after --coverage coverage.json
    python -m benchmarks.test_suite render
    coverage run -m benchmarks.test_suite import-all && coverage json -o imports.json
    python -m benchmarks.test_suite reach fast --coverage coverage.json --imports imports.json

``record`` reads pytest's ``--durations=0`` lines (a test's cost is its setup + call + teardown;
the setup of a shared fixture counts for the first test that uses it) and its last line (the
counts), and a ``coverage json`` report (per file: covered lines and branches), and stores them in
``results/test_durations.json`` under the label, with the CPU, its vector instructions and the
commit. ``reach`` records which modules of ``tfhash/`` a run (the fast tier) executes beyond what
importing them executes. ``render`` writes ``results/test_durations.md``: each run's totals, the
time per test file, the slowest 40 tests, coverage per package with every module that covers
fewer lines or branches than in the run labelled ``before`` (else the first recorded), and the reach.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.common import RESULTS_DIR, cpu_description, markdown_table

NAME = "test_durations"
SLOWEST = 40
#: The run every other run's coverage is compared with, module by module.
BASELINE = "before"
PACKAGES = ("tfhash", "components", "pipelines", "serving")
DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S.*)$")
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")
TOTAL_TIME = re.compile(r" in (\d+\.\d+)s")
XDIST_GROUP = re.compile(r"@[^@\s]+$")  # pytest-xdist's '@group' suffix of a node id


def parse_log(text: str) -> dict:
    """Per-test seconds (setup + call + teardown) and the session's counts and time from pytest's
    terminal output run with ``--durations=0``."""
    tests: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        found = DURATION.match(line.strip())
        if found:
            tests[XDIST_GROUP.sub("", found.group(3))] += float(found.group(1))
    summary = next((line for line in reversed(text.splitlines()) if TOTAL_TIME.search(line) and COUNTS.search(line)), None)
    if not tests or summary is None:
        raise SystemExit("no '--durations=0' lines or no final summary line in the log: run pytest with --durations=0")
    counts = {kind.rstrip("s") if kind.startswith("error") else kind: int(n) for n, kind in COUNTS.findall(summary)}
    return {"tests": dict(tests), "counts": counts, "pytest_seconds": float(TOTAL_TIME.search(summary).group(1))}


def parse_coverage(path: Path) -> dict:
    """``{file: [covered lines, statements, covered branches, branches]}`` of a ``coverage json`` report."""
    report = json.loads(path.read_text())
    return {name: [s["covered_lines"], s["num_statements"], s.get("covered_branches", 0), s.get("num_branches", 0)]
            for name, entry in report["files"].items() for s in [entry["summary"]]}  # fmt: skip


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def load() -> dict:
    path = RESULTS_DIR / f"{NAME}.json"
    return json.loads(path.read_text()) if path.exists() else {"runs": {}}


def record(label: str, log: Path | None, coverage: Path | None, wall: float | None, note: str) -> None:
    """Store a run under ``label``: its durations from ``log``, and / or its coverage (a coverage
    run is slower than a plain one, so its durations are not the label's)."""
    data = load()
    run = data["runs"].get(label, {})
    if log is not None:
        run = {"cpu": cpu_description(), "commit": commit(), "date": time.strftime("%Y-%m-%d"), "note": note,
               **parse_log(log.read_text()), **({"coverage": run["coverage"]} if "coverage" in run else {})}  # fmt: skip
        if wall is not None:
            run["command_seconds"] = wall
    elif not run:
        raise SystemExit(f"no run {label!r} yet: record its durations (--log) first")
    if coverage is not None:
        run["coverage"] = parse_coverage(coverage)
    data["runs"][label] = run
    data["latest"] = label  # tests/workers.py schedules by it
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{NAME}.json").write_text(json.dumps(data, indent=1, sort_keys=True))
    print(f"recorded run {label!r}: {len(run['tests'])} tests, {run['pytest_seconds']:.0f} s"
          + (", with coverage" if "coverage" in run else ""))


def test_file(node: str) -> str:
    return node.split("::", 1)[0]


def percent(covered: int, total: int) -> str:
    return f"{100 * covered / total:.1f}%" if total else "-"


def coverage_rows(runs: dict) -> tuple[list[dict], list[str]]:
    """Coverage per package of every run that has it, and the modules that cover less than in the
    :data:`BASELINE` run."""
    with_coverage = {label: run["coverage"] for label, run in runs.items() if "coverage" in run}
    rows, losses = [], []
    for label, files in with_coverage.items():
        for package in PACKAGES:
            own = [v for name, v in files.items() if name.split("/", 1)[0] == package]
            lines, statements, branches, all_branches = (sum(v[i] for v in own) for i in range(4))
            rows.append({"run": label, "package": package, "modules": len(own), "lines covered": f"{lines} / {statements}",
                         "line coverage": percent(lines, statements), "branches covered": f"{branches} / {all_branches}",
                         "branch coverage": percent(branches, all_branches)})  # fmt: skip
    labels = sorted(with_coverage, key=lambda label: label != BASELINE)  # the baseline first, then in recorded order
    for label in labels[1:]:
        first, now = with_coverage[labels[0]], with_coverage[label]
        for name, (lines, _, branches, _) in sorted(first.items()):
            got = now.get(name, [0, 0, 0, 0])
            if got[0] < lines or got[2] < branches:
                losses.append(f"{label}: {name} covers {got[0]} lines and {got[2]} branches, {labels[0]} {lines} and {branches}")
    return rows, losses


def import_every_module() -> None:
    """Import every module of ``tfhash/`` (the baseline of :func:`reach`: what importing covers)."""
    import importlib
    import pkgutil

    import tfhash

    for module in pkgutil.walk_packages(tfhash.__path__, "tfhash."):
        importlib.import_module(module.name)


def executed_lines(path: Path) -> dict[str, set[int]]:
    """``{file: executed lines}`` of a ``coverage json`` report."""
    return {name: set(entry["executed_lines"]) for name, entry in json.loads(path.read_text())["files"].items()}


def reach(label: str, coverage: Path, imports: Path) -> None:
    """Record which modules of ``tfhash/`` a run (the fast tier) executes beyond what importing them
    executes: a module whose only covered lines are its imports and definitions has no test there."""
    ran, imported = executed_lines(coverage), executed_lines(imports)
    modules = sorted(name for name in imported if name.startswith("tfhash/"))
    rows = {name: [len(imported[name]), len(ran.get(name, set()) - imported[name])] for name in modules}
    data = load()
    data.setdefault("reach", {})[label] = rows
    (RESULTS_DIR / f"{NAME}.json").write_text(json.dumps(data, indent=1, sort_keys=True))
    untested = [name for name, (_, beyond) in rows.items() if beyond == 0]
    print(f"{label}: {len(modules) - len(untested)} of {len(modules)} modules of tfhash/ run beyond their import"
          + (f"; not: {untested}" if untested else ""))


def render() -> Path:
    runs = load()["runs"]
    if not runs:
        raise SystemExit("no recorded run: use 'record' first")
    totals = [{"run": label, "commit": run["commit"], "date": run["date"], "CPU": run["cpu"],
               **{kind: run["counts"].get(kind, 0) for kind in ("passed", "failed", "skipped", "deselected")},
               "pytest s": round(run["pytest_seconds"], 1), "whole command s": run.get("command_seconds", ""),
               "note": run.get("note", "")} for label, run in runs.items()]  # fmt: skip
    files = sorted({test_file(node) for run in runs.values() for node in run["tests"]})
    per_file = [{"file": name, **{f"{label} s": round(sum(s for node, s in run["tests"].items() if test_file(node) == name), 1)
                                  for label, run in runs.items()}} for name in files]  # fmt: skip
    last = load().get("latest", list(runs)[-1])
    per_file.sort(key=lambda row: -max(v for k, v in row.items() if k != "file"))
    parts = ["# The test suite: time and coverage", "", __doc__.split("\n\n")[0].replace("\n", " "), "",
             "Timings are of one run each, on the CPU named in its row: compare runs on one machine as ratios.", "",
             "## Runs", "", markdown_table(totals, list(totals[0])), "",
             "## Seconds per test file", "", markdown_table(per_file, ["file", *[f"{label} s" for label in runs]])]  # fmt: skip
    for label, run in runs.items():
        slowest = sorted(run["tests"].items(), key=lambda item: -item[1])[:SLOWEST]
        rows = [{"test": node, "seconds": round(seconds, 1)} for node, seconds in slowest]
        parts += ["", f"## The slowest {SLOWEST}: {label}", "", markdown_table(rows, ["test", "seconds"])]
    rows, losses = coverage_rows(runs)
    if rows:
        parts += ["", "## Coverage per package", "", "`coverage run` with `patch = subprocess` (pyproject.toml): the processes "
                  "the tests start are measured too.", "", markdown_table(rows, list(rows[0])), "",
                  f"Modules that cover fewer lines or branches than in the run {BASELINE!r}: " + ("; ".join(losses) if losses else "none.")]  # fmt: skip
    for label, rows in load().get("reach", {}).items():
        untested = sorted(name for name, (_, beyond) in rows.items() if beyond == 0)
        parts += ["", f"## Modules of tfhash/ the {label} run runs beyond their import", "",
                  f"{len(rows) - len(untested)} of {len(rows)} modules: lines executed by the run that importing the "
                  "module does not execute (`python -m benchmarks.test_suite reach`)."
                  + (f" None beyond the import: {', '.join(untested)}." if untested else " Every module."), "",
                  markdown_table([{"module": name, "lines run by importing": imported, "lines run beyond": beyond}
                                  for name, (imported, beyond) in sorted(rows.items())],
                                 ["module", "lines run by importing", "lines run beyond"])]  # fmt: skip
    path = RESULTS_DIR / f"{NAME}.md"
    path.write_text("\n".join(parts) + "\n")
    print(f"wrote {path} (latest run: {last})")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    recording = commands.add_parser("record", help="store a run's durations (and coverage) under a label")
    recording.add_argument("label")
    recording.add_argument("--log", type=Path, help="pytest's terminal output, run with --durations=0")
    recording.add_argument("--coverage", type=Path, help="the run's 'coverage json' report")
    recording.add_argument("--wall", type=float, help="seconds of the whole command (set-up included)")
    recording.add_argument("--note", default="", help="how the run was made (fresh clone, tier, ...)")
    reaching = commands.add_parser("reach", help="store which modules of tfhash/ a run executes beyond their import")
    reaching.add_argument("label")
    reaching.add_argument("--coverage", type=Path, required=True, help="the run's 'coverage json' report")
    reaching.add_argument("--imports", type=Path, required=True, help="'coverage json' of 'import-all' (the baseline)")
    commands.add_parser("import-all", help="import every module of tfhash/ (run it under coverage for reach's baseline)")
    commands.add_parser("render", help="write results/test_durations.md from the recorded runs")
    args = parser.parse_args()
    if args.command == "import-all":
        import_every_module()
        return
    if args.command == "record":
        record(args.label, args.log, args.coverage, args.wall, args.note)
    elif args.command == "reach":
        reach(args.label, args.coverage, args.imports)
    render()


if __name__ == "__main__":
    main()
