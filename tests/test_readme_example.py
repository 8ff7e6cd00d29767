"""The README's "Your own data in Keras" example runs as written, in a new process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def own_data_example() -> str:
    section = README.read_text().split("## Your own data in Keras", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_example_is_short():
    assert len(own_data_example().splitlines()) <= 35


@pytest.mark.process
def test_the_own_data_example_runs_as_written(tmp_path):
    run = subprocess.run([sys.executable, "-c", own_data_example()], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    printed = run.stdout
    validation = [float(v) for v in re.search(r"validation mAP by 10 epochs: \[(.*)\]", printed).group(1).split(",")]
    assert len(validation) == 3 and all(0.0 < v <= 1.0 for v in validation)
    assert 0.8 < float(re.search(r"test mAP: ([\d.]+)", printed).group(1)) <= 1.0
    assert re.search(r"^1597 codes; first query's neighbours: \[.*\] classes \[.*\] query class \d$", printed, re.M)
    for written in ("digits.keras", "serving/digits/1/saved_model.pb", "index/1/BFlat/manifest.json"):
        assert (tmp_path / written).is_file(), written
