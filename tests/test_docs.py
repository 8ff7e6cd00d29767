"""The design reference lives in the repository (``docs/design.md``) and the code cites only it:
no docstring or comment points at a file outside the repository or at an issue tracker, and every
``docs/design.md s.N`` (or ``#anchor``) citation names a section that exists."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
#: The packages whose sources must cite only what the repository holds.
PACKAGES = ("tfhash", "components", "pipelines", "serving", "benchmarks", "scripts")
GENERATED = ("_pb2.py", "_pb2_grpc.py")
#: Paths outside the repository. The data directory (``../shared/data`` by default) is not among
#: them: the code reads it at run time, and says so.
OUTSIDE = re.compile(r"/work/shared|shared/(?!data\b)\w+|\.\./shared(?!/data\b)|\.\./(?:papers|peers)\b")
ISSUE = re.compile(r"(?i)\bissues?\s*(?:no\.?\s*)?#?\d+")
HASH_NUMBER = re.compile(r"(?:^|[\s(\[,;])#\d+\b")
CITATION = re.compile(r"design\.md\)?\s+s\.\s*(\d+)(?:\s*-\s*(\d+))?")
ANCHOR = re.compile(r"design\.md#([\w-]+)")


def sources(*suffixes: str) -> list[Path]:
    found = []
    for package in PACKAGES:
        found += [p for p in (ROOT / package).rglob("*") if p.suffix in suffixes and not p.name.endswith(GENERATED)]
    return sorted(found)


def sections() -> dict[int, str]:
    """``{number: anchor}`` of the numbered ``##`` sections of docs/design.md (GitHub's anchors)."""
    headings = re.findall(r"^## (\d+)\. (.+)$", DESIGN.read_text(), re.MULTILINE)
    return {int(number): slug(f"{number}. {title}") for number, title in headings}


def slug(heading: str) -> str:
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and docstring of a Python file."""
    text = path.read_text()
    found = [(token.start[0], token.string.lstrip("#")) for token in tokenize.generate_tokens(io.StringIO(text).readline)
             if token.type == tokenize.COMMENT]  # fmt: skip
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                found.append((node.body[0].lineno, docstring))
    return found


def test_design_reference_has_its_sections_in_order():
    numbers = list(sections())
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 10, numbers
    assert "docs/design.md" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("path", sources(".py", ".proto", ".sh"), ids=lambda p: str(p.relative_to(ROOT)))
def test_sources_cite_only_the_repository(path):
    text = path.read_text()
    for match in re.finditer(r"(?i)[\w./-]*design\.md", text):
        assert match.group(0) == "docs/design.md", f"{path}: cites {match.group(0)!r}, not docs/design.md"
    outside = sorted({m.group(0) for m in OUTSIDE.finditer(text)})
    assert not outside, f"{path}: points outside the repository: {outside}"
    issues = sorted({m.group(0) for m in ISSUE.finditer(text)})
    assert not issues, f"{path}: names issues {issues}; say what the code does instead"
    if path.suffix == ".py":
        numbered = [(line, m.group(0).strip()) for line, part in comments_and_docstrings(path) for m in HASH_NUMBER.finditer(part)]
        assert not numbered, f"{path}: issue-style references {numbered}"


def test_every_citation_names_an_existing_section():
    known = sections()
    cited = sources(".py", ".proto") + sorted((ROOT / "tests").glob("*.py")) + [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    wrong = []
    for path in cited:
        text = path.read_text()
        for match in CITATION.finditer(text):
            first, last = int(match.group(1)), int(match.group(2) or match.group(1))
            wrong += [f"{path.relative_to(ROOT)}: s.{n}" for n in range(first, last + 1) if n not in known]
        wrong += [f"{path.relative_to(ROOT)}: #{m.group(1)}" for m in ANCHOR.finditer(text) if m.group(1) not in known.values()]
    assert not wrong, f"citations of sections docs/design.md does not have: {wrong}"


def test_the_checks_catch_what_they_are_for(tmp_path):
    """The patterns above find the references they exist to refuse, and pass the ones allowed."""
    assert OUTSIDE.search("see ../shared/docs/DESIGN.md") and OUTSIDE.search("``../shared/peers/README.md``")
    assert not OUTSIDE.search("default: $TFHASH_DATA_ROOT or ../shared/data")
    assert ISSUE.search("(our addition, see issue 4)") and ISSUE.search("Issue #12") and not ISSUE.search("issues a warning")
    assert HASH_NUMBER.search("fixed in #12") and not HASH_NUMBER.search("colour #1f77b4")
    assert [m.groups() for m in CITATION.finditer("(docs/design.md s.2-3) and docs/design.md s.4")] == [("2", "3"), ("4", None)]
    sample = tmp_path / "sample.py"
    sample.write_text('"""Module (see #7)."""\n\n\ndef f():\n    """Nothing."""\n    return 1  # as issue 3 asks\n')
    assert [line for line, _ in comments_and_docstrings(sample)] == [6, 1, 5]


def test_module_docstrings_say_what_and_why_in_ten_lines():
    long = {str(path.relative_to(ROOT)) for path in sources(".py") if path.parts[len(ROOT.parts)] in ("tfhash", "components", "pipelines", "serving")
            and len((ast.get_docstring(ast.parse(path.read_text()), clean=False) or "").strip("\n").splitlines()) > 10}  # fmt: skip
    assert sorted(long) == [], "a module docstring over ten lines: keep what and why, move the rest to the class or function it describes"
