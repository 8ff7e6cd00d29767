"""A pipeline config is checked completely when it is read, before TensorFlow or TFX load, and
every message names the file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tfhash.pipelines.config import PipelineConfig

CASES = {
    "a misspelt key": ({"name": "x", "datset": "mnist"}, r"unknown setting 'datset': did you mean 'dataset'\?"),
    "a misspelt training key": ({"name": "x", "training": {"bakbone": "squeezenet"}},
                                r"unknown setting 'training.bakbone': did you mean 'backbone'\?"),
    "a misspelt method": ({"name": "x", "training": {"method": "schd"}}, r"unknown method 'schd'.*did you mean 'scdh'\?"),
    "a misspelt dataset": ({"name": "x", "dataset": "mnsit"}, r"unknown dataset 'mnsit'.*did you mean 'mnist'\?"),
    "weights that are no file": ({"name": "x", "training": {"backbone": "squeezenet", "backbone_weights": "imagnet"}},
                                 r"weights '.*imagnet' is neither 'imagenet' nor an existing weights file \(did you mean 'imagenet'\?\)"),
    "a data folder not exported": ({"name": "x", "data_dir": "nowhere"}, r"data_dir '.*nowhere' holds no metadata.json"),
    "a data root that is no folder": ({"name": "x", "data_root": "nowhere"}, r"data_root '.*nowhere' is not a folder"),
    "epochs as text": ({"name": "x", "training": {"epochs": "ten"}}, r"training.epochs must be a positive integer, got 'ten'"),
    "a threshold above 1": ({"name": "x", "map_threshold": 5}, r"map_threshold must be a number from 0.0 to 1.0, got 5"),
    "bits that cannot be packed": ({"name": "x", "training": {"bits": 30}}, r"bits must be a positive multiple of 8"),
    "no name": ({"dataset": "mnist"}, r"missing setting 'name' \(the run's name"),
    "a cut the network does not have": ({"name": "x", "dataset": "cifar10", "training": {
        "backbone": "squeezenet", "fine_tuning": {"trunk_cache": {"cut": "pool_1"}}}},
        r"backbone 'squeezenet' has no layer 'pool_1'; did you mean \['pool1'"),
    "a misspelt input map": ({"name": "x", "dataset": "wiki", "modalities": ["image", "text"], "training": {
        "method": "jcch", "backbone": "mlp", "input_map": {"text": "rfb"}}},
        r"training.input_map of 'text' is 'rfb'; choose one of \['none', 'standardise', 'rbf'\]; did you mean 'rbf'\?"),
    "an input map of no input": ({"name": "x", "dataset": "wiki", "modalities": ["image", "text"], "training": {
        "method": "jcch", "backbone": "mlp", "input_map": {"tags": "rbf"}}},
        r"training.input_map names the towers \['tags'\]; the data's towers are \['image', 'text'\]"),
    "widths for a tower the run does not have": ({"name": "x", "dataset": "wiki", "modalities": ["image", "text"], "training": {
        "method": "jcch", "backbone": "mlp", "hidden": {"image": [1024], "tags": [64]}}},
        r"training.hidden names the towers \['image', 'tags'\]; the data's towers are \['image', 'text'\]: give one list"),
    "widths that are no widths": ({"name": "x", "training": {"backbone": "mlp", "hidden": {"image": [0]}}},
        r"training.hidden of 'image' must be a list of positive layer widths"),
    "an input map before an image network": ({"name": "x", "training": {"input_map": "rbf"}},
        r"training.input_map and training.fine_tuning.input_dropout are for feature vectors \(the mlp backbone\); backbone "
        r"'small_cnn' takes images"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_config_is_refused_naming_the_file(tmp_path, case):
    raw, message = CASES[case]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=message) as refused:
        PipelineConfig.load(path)
    assert str(refused.value).startswith(f"{path}: ")


@pytest.mark.process
def test_a_typo_is_reported_before_tensorflow_or_tfx_load(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"name": "x", "training": {"backbone": "squeezenet", "backbone_weights": "imagnet"}}))
    script = ("import sys\nfrom click.testing import CliRunner\nfrom tfhash.cli import main\n"
              f"result = CliRunner().invoke(main, ['pipeline', 'run', '--config', {str(path)!r}])\n"
              "print(result.exit_code, result.output.strip().splitlines()[-1])\n"
              "print(sorted(m for m in ('tensorflow', 'keras', 'tfx', 'apache_beam') if m in sys.modules))")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    status, loaded = run.stdout.strip().splitlines()
    assert status.startswith("2 Error: ") and "did you mean 'imagenet'" in status
    assert loaded == "[]"
