"""The documentation site (``mkdocs.yml``, ``docs/``) and the README: the site builds in strict
mode (a broken link, anchor or API reference fails), the API reference names exactly each public
module's ``__all__``, every Python block of the README and of the pages runs as written, and every
command of their shell blocks exists with the options it is given."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tfhash.cli import main as tfhash_command

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: The README and the pages whose code blocks are run or checked (the reference is generated).
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
#: A reference entry: the module and the public names it lists, one per line.
ENTRY = re.compile(r"^::: (\S+)\n    options:\n      members:\n((?:        - \S+\n)+)", re.M)
#: A fenced block, with the reason it is not run when the line before it gives one
#: (``<!-- not run: why -->``).
BLOCK = re.compile(r"^(?:<!-- not run: (?P<why>.+?) -->\n)?```(?P<language>\w*)\n(?P<body>.*?)^```", re.S | re.M)
#: The top-level folders that install inside the tfhash package (pyproject.toml's package-dir).
MAPPED = ("components", "pipelines", "serving")
#: What each page's blocks must print (beyond running without error).
PRINTS = {
    "README.md": [r"^mAP: 0\.(8[5-9]|9[0-4])\d$"],  # 0.900 on the CPUs measured
    "keras.md": [r"^MNIST mAP: 0\.9\d\d$", r"^validation mAP by 10 epochs: \['0\.\d{3}', '0\.\d{3}', '0\.\d{3}'\]$",
                 r"^test mAP: 0\.(8[5-9]|9[0-4])\d$",  # 0.900 on the CPUs measured
                 r"^1597 codes; first query's neighbours: \[.*\] classes \[.*\] query class \d$"],
    "recipes.md": [r"validation mAP@all"],
}  # fmt: skip


def reference() -> dict[str, list[str]]:
    """``{module: names}`` as the API reference pages list them."""
    found = {}
    for page in sorted((DOCS / "reference").glob("*.md")):
        for module, members in ENTRY.findall(page.read_text()):
            found[module] = [line.strip()[2:] for line in members.splitlines()]
    return found


def assigns_all(node: ast.stmt) -> bool:
    """Whether a module-level statement assigns ``__all__`` (plainly or annotated)."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets)


def shipped_modules() -> dict[str, bool]:
    """``{module: whether its source assigns __all__}`` for every module the package installs (the
    generated ``*_pb2*`` modules aside)."""
    found = {}
    for folder, package in [("tfhash", "tfhash"), *((m, f"tfhash.{m}") for m in MAPPED)]:
        for path in (ROOT / folder).rglob("*.py"):
            if "_pb2" in path.name:
                continue
            tree = ast.parse(path.read_text())
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join([package, *parts[:-1]] if parts[-1] == "__init__" else [package, *parts])
            found[name] = any(assigns_all(node) for node in tree.body)
    return found


def blocks(page: Path, language: str, run: bool = False) -> list[str]:
    """The ``language`` blocks of ``page`` (``run``: only those not marked as not run)."""
    found = [m for m in BLOCK.finditer(page.read_text()) if m.group("language") == language]
    return [m.group("body") for m in found if not (run and m.group("why"))]


#: Modules of the package with no reference entry of their own, and why. Beyond these, a module
#: without an entry must be a submodule of a documented package (the names the package re-exports
#: are documented there) or a module of the pipeline's stages and of serving (behind the commands).
UNDOCUMENTED = {
    "tfhash": "its __all__ names the public modules, each documented",
    "tfhash._version": "tfhash.__version__",
    "tfhash.cli": "the tfhash command (its --help and the pages' command lines, checked below)",
    "tfhash.console": "what the tfhash command prints",
    "tfhash.resources": "data files",
}  # fmt: skip


def test_every_module_states_its_public_names():
    assert not [module for module, declares in shipped_modules().items() if not declares], "a module has no __all__"


def test_the_reference_names_every_public_name_and_only_those():
    listed = reference()
    import tfhash

    assert {f"tfhash.{m}" for m in tfhash.__all__ if m != "__version__"} <= set(listed)
    for module in shipped_modules():
        package, stage = module.rsplit(".", 1)[0], module.split(".")[1] if "." in module else ""
        assert module in listed or module in UNDOCUMENTED or stage in MAPPED or package in listed, \
            f"{module} has no reference entry"  # fmt: skip
    for module, names in listed.items():
        public = importlib.import_module(module).__all__
        assert names == list(public), f"{module}: the reference lists {names}, __all__ is {public}"
        assert all(hasattr(importlib.import_module(module), name) for name in names), module


def test_the_reference_index_links_every_documented_module():
    index = (DOCS / "reference" / "index.md").read_text()
    assert [module for module in reference() if f"#{module})" not in index] == []


#: Names the pages write like Python names that are not: what each is.
NOT_PYTHON = {"tfhash.serving.HashSearch": "the search service's gRPC name (serving/search.proto)"}


def undocumented_names(pages: list[Path]) -> list[str]:
    """The ``tfhash.`` names the pages write (in backticks) that are neither a module nor an object
    the API reference lists (a re-export of a listed object counts: it is the same object)."""
    listed = reference()
    documented = {id(getattr(importlib.import_module(module), name)) for module, names in listed.items() for name in names}
    missing = []
    for page in pages:
        for name in sorted(set(re.findall(r"`(tfhash(?:\.\w+)+)", page.read_text())) - set(NOT_PYTHON)):
            parts = name.split(".")
            for i in range(len(parts), 0, -1):  # the longest prefix that is a module (tfhash at least)
                try:
                    module = importlib.import_module(".".join(parts[:i]))
                except ImportError:
                    continue
                rest = parts[i:]
                if rest and not rest[0].startswith("__") and id(getattr(module, rest[0], None)) not in documented:
                    missing.append(f"{page.name}: {name}")
                break
    return missing


def test_every_name_the_pages_use_is_in_the_reference(tmp_path):
    assert undocumented_names(PAGES) == []
    page = tmp_path / "p.md"
    page.write_text("`tfhash.codes.pack_codes`, `tfhash.codes`, `tfhash.tuning.search.TRAIN_IN_DATABASE`, `tfhash.labels.__all__`, "
                    "`tfhash.serving.HashSearch`, `tfhash.tuning.search.hyperparameters_of`, `tfhash.nothing.here`")  # fmt: skip
    assert undocumented_names([page]) == ["p.md: tfhash.nothing.here", "p.md: tfhash.tuning.search.hyperparameters_of"]


def test_the_reference_catches_a_name_that_appears_or_disappears(tmp_path, monkeypatch):
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "x.md").write_text("::: tfhash.codes\n    options:\n      members:\n        - pack_codes\n")
    monkeypatch.setattr(sys.modules[__name__], "DOCS", tmp_path)
    assert reference() == {"tfhash.codes": ["pack_codes"]}
    with pytest.raises(AssertionError):
        test_the_reference_names_every_public_name_and_only_those()


def test_the_readme_is_short_and_its_keras_example_shorter():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    first = blocks(ROOT / "README.md", "python")[0]
    assert len(first.splitlines()) <= 15 and "tfhash.components" not in first


@pytest.mark.process
def test_the_site_builds_in_strict_mode(tmp_path):
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    built = (tmp_path / "site" / "reference" / "keras" / "index.html").read_text()
    assert 'id="tfhash.codes.pack_codes"' in built and 'id="tfhash.models.build_scdh"' in built
    assert ":func:" not in built and "<code>pack_codes</code>" in built  # roles shown as code, not as text
    listing = (tmp_path / "site" / "results" / "contents" / "index.html").read_text()
    results = sorted((ROOT / "benchmarks" / "results").glob("*.md"))
    for page in results:  # every results file listed (results/index.md is the folder's own page), with its run line
        assert f'href="../{"" if page.stem == "index" else page.stem + "/"}"' in listing, page.name
    assert len(re.findall(r"<td>(Run at|Run with the code of|Recorded before results pages named their) commit", listing)) == len(results)


@pytest.mark.process
@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "python", run=True)], ids=lambda p: p.name)
def test_the_python_blocks_run_as_written(page, tmp_path):
    code = "\n".join(blocks(page, "python", run=True))
    assert len(blocks(page, "python")) - len(blocks(page, "python", run=True)) <= 1, f"{page.name}: more than one block not run"
    assert "tfhash.components" not in code, f"{page.name}: an example imports a pipeline stage"
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=1200, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    for expected in PRINTS.get(page.name, []):
        assert re.search(expected, run.stdout, re.M), f"{page.name}: {expected!r} not in\n{run.stdout[-3000:]}"


def command_of(words: list[str]) -> tuple[click.Command, list[str]]:
    """The ``tfhash`` command a line names and the words after it."""
    command, rest = tfhash_command, words[1:]
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        assert rest[0] in command.commands, f"no command {' '.join(words[: len(words) - len(rest) + 1])}"
        command, rest = command.commands[rest[0]], rest[1:]
    return command, rest


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "bash")], ids=lambda p: p.name)
def test_the_shell_blocks_name_commands_and_options_that_exist(page):
    for block in blocks(page, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            if words[0] == "tfhash":
                command, rest = command_of(words)
                options = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
                given = {word.split("=", 1)[0] for word in rest if word.startswith("--")}
                assert given <= options, f"{page.name}: {line!r}: {sorted(given - options)} not options of the command"
            elif words[:2] == ["python", "-m"] or words[:2] == [".venv/bin/python", "-m"]:
                assert importlib.util.find_spec(words[2]) is not None, f"{page.name}: {line!r}: no module {words[2]}"
            elif words[0] == "bash" and words[1].endswith(".sh"):
                assert (ROOT / words[1]).is_file(), f"{page.name}: {line!r}: no script {words[1]}"


#: A Markdown link or image: its target, before an optional title.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def broken_links(pages: list[Path]) -> list[str]:
    """The relative links of ``pages`` (outside code blocks) whose file is not in the repository:
    the pages read on the repository as on the site (the site's hook maps the results folder)."""
    broken = []
    for page in pages:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for target in LINK.findall(text):
            path = target.split("#", 1)[0]
            if path and not re.match(r"^[a-z]+:", path) and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(page.parents[1]) if page.parent != ROOT else page.name}: {target}")
    return broken


def test_every_link_of_the_pages_reads_on_the_repository(tmp_path):
    assert broken_links([*PAGES, *sorted((DOCS / "reference").glob("*.md"))]) == []
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "p.md"
    page.write_text("[a](../x.md) [b](results/y.md#z) ![c](img.png) [d](https://e.org) [e](#f)\n```\n[g](nothing.md)\n```\n")
    (tmp_path / "x.md").write_text("")
    assert broken_links([page]) == ["docs/p.md: results/y.md#z", "docs/p.md: img.png"]


def test_the_readme_states_the_last_recorded_run_of_the_suite():
    from benchmarks.common import RESULTS_DIR

    recorded = json.loads((RESULTS_DIR / "test_durations.json").read_text())
    run = recorded["runs"][recorded["latest"]]
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| the whole test suite"))
    tests = sum(run["counts"].get(k, 0) for k in ("passed", "failed", "skipped"))
    assert f"{run['commit']})" in row and f"{tests} tests in {run['pytest_seconds']:.0f} s ({run['command_seconds']:.0f} s with" in row, row


def extras() -> list[str]:
    """The extras ``pyproject.toml`` declares (``all`` aside)."""
    section = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return [name for name in re.findall(r"^(\w[\w-]*)\s*=", section, re.M) if name != "all"]


def test_the_extras_tables_name_every_extra():
    assert "images" in extras() and "tuning" in extras()
    for page in (ROOT / "README.md", DOCS / "getting-started.md"):
        assert [name for name in extras() if f"| `{name}` |" not in page.read_text()] == [], page.name


def test_every_results_page_names_the_run_that_wrote_it():
    """The evidence pages render ``benchmarks/results/``: each ends with the code, CPU and time of
    its run (:func:`benchmarks.common.run_line`), or says that its run recorded no commit."""
    from benchmarks.common import RESULTS_DIR, run_line

    pages = sorted(RESULTS_DIR.glob("*.md"))
    assert len(pages) > 20
    unnamed = [p.name for p in pages if not re.search(r"^(Run (at|with the code of) commit \S+|Recorded before results pages named "
                                                      r"their commit: run) .*CPUs?\b", p.read_text().rstrip().rsplit("\n", 1)[-1])]  # fmt: skip
    assert unnamed == []
    assert re.fullmatch(r"Run at commit abc1234 on AMD EPYC \(2 CPUs\), 2026-01-01 00:00:00; Python 3\.10\.13\.",
                        run_line({"commit": "abc1234", "cpu": "AMD EPYC", "cpus": 2, "date": "2026-01-01 00:00:00", "python": "3.10.13"}))  # fmt: skip
