"""A folder of one's own photos to a searchable service: the "Your own images" page's block run as
written, on a folder this test makes, and the pipeline page's table of config keys."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tfhash.pipelines.config import key_table

DOCS = Path(__file__).resolve().parents[1] / "docs"


def make_photos(root: Path, seed: int = 0) -> None:
    """Three classes of 14 photos (reddish cats, striped greenish dogs, bluish owls) in two sizes,
    a greyscale owl and a corrupt file among the dogs."""
    rng = np.random.default_rng(seed)
    colours = {"cat": (200, 60, 40), "dog": (40, 170, 60), "owl": (50, 70, 200)}
    for name, colour in colours.items():
        (root / name).mkdir(parents=True)
        for i in range(14):
            height, width = (120, 90) if i % 3 else (100, 100)
            pixels = np.array(colour, float) + rng.normal(0, 25, (height, width, 3))
            if name == "dog":
                pixels += ((np.arange(width) // (6 + i % 4)) % 2 * 40)[None, :, None]
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(root / name / f"{i + 1:04d}.jpg")
    Image.fromarray(np.full((120, 90), 90, np.uint8)).save(root / "owl" / "grey.jpg")
    (root / "dog" / "corrupt.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")


def test_the_pipeline_page_lists_every_config_key_as_the_config_does():
    assert key_table() in (DOCS / "pipeline.md").read_text().split("## Every config key\n", 1)[1]


@pytest.mark.process
def test_the_own_images_journey_runs_as_the_page_writes_it(tmp_path):
    block = re.search(r"```bash\n(.*?)```", (DOCS / "own-images.md").read_text(), re.S).group(1)
    make_photos(tmp_path / "photos")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    lines = run.stdout.splitlines()

    rest = json.loads(next(line for line in lines if line.startswith('{"model_version"')))["results"][0]
    assert len(rest["paths"]) == 5 and all(path.endswith(".jpg") for path in rest["paths"])
    assert sum(labels == ["cat"] for labels in rest["labels"]) >= 4  # a cat's nearest photos are mostly cats
    paths, labels = lines[-1].split("] [", 1)
    assert paths.count("owl/") >= 4 and labels.count("'owl'") >= 4  # the gRPC client's answer for an owl

    metadata = json.loads((tmp_path / "runs/photos/data/metadata.json").read_text())
    notes = metadata["notes"]["images"]
    assert notes["skipped"][0]["path"] == "dog/corrupt.jpg" and notes["converted"] == {"L to RGB": 1}
    summary = json.loads((tmp_path / "runs/photos/summary.json").read_text())
    example = summary["example_query"]
    assert summary["blessed"] and example["query_item"]["path"].endswith(".jpg")
    assert all(item["path"] and item["labels"] for item in example["answers"]["BFlat"]["nearest_items"])
