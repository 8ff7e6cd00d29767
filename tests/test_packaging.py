"""The wheel installs everything under the tfhash namespace (no top-level `components`,
`pipelines` or `serving` modules in site-packages), with the search service's gRPC modules generated
at build time; the set-up scripts refuse a disk too small before they start."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.process
def test_wheel_has_only_the_tfhash_namespace(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("tfhash-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert {t for t in top_level if not t.startswith("tfhash")} == set()
    for module in ("tfhash/components/__init__.py", "tfhash/pipelines/__init__.py", "tfhash/serving/__init__.py",
                   "tfhash/losses/__init__.py", "tfhash/index/__init__.py", "tfhash/py.typed",
                   "tfhash/serving/search_pb2.py", "tfhash/serving/search_pb2_grpc.py"):  # fmt: skip
        assert module in names
    # every module of the source tree is in the wheel (a subpackage missing from pyproject.toml's
    # packages would install without it)
    mapped = {"tfhash": "tfhash", "components": "tfhash/components", "pipelines": "tfhash/pipelines", "serving": "tfhash/serving"}
    sources = {f"{target}/{path.relative_to(ROOT / folder).as_posix()}" for folder, target in mapped.items()
               for path in (ROOT / folder).rglob("*.py")}  # fmt: skip
    assert sorted(sources - set(names)) == []


@pytest.mark.process
@pytest.mark.parametrize("need_gb, refused", [(0, False), (10**9, True)])
def test_setup_refuses_a_disk_too_small_before_starting(tmp_path, need_gb, refused):
    check = f'source scripts/free_space.sh && require_free_gb setup_env "{tmp_path}" {need_gb} "installing"'
    result = subprocess.run(["bash", "-c", check], cwd=ROOT, capture_output=True, text=True)
    assert (result.returncode != 0) == refused
    if refused:
        assert f"MB free on the file system of {tmp_path}; installing needs about {need_gb} GB" in result.stderr
        assert "free some space there" in result.stderr
    else:
        assert result.stderr == ""
