"""MkDocs hooks: the benchmark results (``benchmarks/results/``) become pages of the site under
``results/``, so that the evidence pages link to the files the benchmarks wrote (the pages link to
``../benchmarks/results/<file>``, which reads on the repository, and the site's copy takes its
place, the folder itself becoming the generated contents page); and the API
reference reads the package as it installs (``serving/`` as ``tfhash.serving``, and the other
folders ``pyproject.toml`` maps), from a tree of links made for the build, showing the docstrings'
Sphinx roles as code."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: The top-level folders that install inside the tfhash package (pyproject.toml's package-dir).
MAPPED = ("components", "pipelines", "serving")


#: A Sphinx cross-reference role as the docstrings write it (``:func:`name```), once rendered.
ROLE = re.compile(r":(?:func|class|meth|data|attr|mod|exc|obj|const):(?=<code>)")


#: The tree of links the reference reads (mkdocs.yml's mkdocstrings ``paths``); made at each build.
TREE = ROOT / ".docs-package"


def on_startup(command, dirty):
    shutil.rmtree(TREE, ignore_errors=True)
    package = TREE / "tfhash"
    package.mkdir(parents=True)
    for entry in (ROOT / "tfhash").iterdir():
        (package / entry.name).symlink_to(entry)
    for folder in MAPPED:
        (package / folder).symlink_to(ROOT / folder)


#: The generated page listing every results file (a name no benchmark writes: they write ``<name>.md``).
CONTENTS = "results/contents.md"


def run_line(text: str) -> str:
    """The line a results file ends with, naming its commit, CPU and date (``benchmarks.common.run_line``)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def contents(pages: list[Path]) -> str:
    """The page listing ``pages``: each file's title and its run line (commit, CPU, date)."""
    rows = [f"| [{path.stem}]({path.name}) | {path.read_text().splitlines()[0].lstrip('# ').replace('|', '/')} "
            f"| {run_line(path.read_text()).replace('|', '/')} |" for path in pages]  # fmt: skip
    return "\n".join(["# Every results file", "",
                      "Each file of `benchmarks/results/` as its benchmark wrote it, with the line that names the commit whose "
                      "code it ran, the CPU and the date. Compare timings only within one file: they are ratios of one run.", "",
                      "| file | what it measures | run |", "|---|---|---|", *rows, ""])  # fmt: skip


def on_files(files, config):
    pages = []
    for path in sorted(RESULTS.iterdir()):
        if path.suffix in (".md", ".png", ".json"):
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
        if path.suffix == ".md":
            pages.append(path)
    files.append(File.generated(config, CONTENTS, content=contents(pages)))
    return files


#: A page's link into the results folder, as the pages write it (read on the repository).
RESULTS_LINK = re.compile(r"\]\(\.\./benchmarks/results/([^)]*)\)")


def site_link(match: re.Match) -> str:
    """The link to a results file's page on the site; the folder's own link to the contents page."""
    return f"](results/{match.group(1) or 'contents.md'})"


def on_page_markdown(markdown, page, config, files):
    """Links into ``benchmarks/results/`` point at the site's copies (:data:`RESULTS_LINK`)."""
    return RESULTS_LINK.sub(site_link, markdown)


def on_page_content(html, page, config, files):
    """The reference shows a role's target as code: the docstrings name targets the Sphinx way
    (``:func:`pack_codes```), which mkdocstrings' Google style leaves as text."""
    return ROLE.sub("", html)
