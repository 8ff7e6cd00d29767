"""MkDocs hooks: the benchmark results (``benchmarks/results/``) become pages of the site under
``results/``, so that the evidence pages link to the files the benchmarks wrote; and the API
reference reads the package as it installs (``serving/`` as ``tfhash.serving``, and the other
folders ``pyproject.toml`` maps), from a tree of links made for the build."""

from __future__ import annotations

import shutil
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: The top-level folders that install inside the tfhash package (pyproject.toml's package-dir).
MAPPED = ("components", "pipelines", "serving")


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


def on_files(files, config):
    for path in sorted(RESULTS.iterdir()):
        if path.suffix in (".md", ".png", ".json"):
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    return files
