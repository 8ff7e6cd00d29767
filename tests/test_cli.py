"""The tfhash command line, run as a user would (click's runner, real files)."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from tfhash.cli import main
from tfhash.codes import check_bits


def check_bits_message(bits) -> str:
    """What :func:`tfhash.codes.check_bits` says of ``bits``."""
    with pytest.raises(ValueError) as refused:
        check_bits(bits)
    return str(refused.value)


def test_help_lists_commands():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for command in ("quickstart", "evaluate", "data"):
        assert command in result.output
    assert "The shipped datasets and your own: export, query images." in result.output


def test_evaluate_help_names_the_arrays_it_needs():
    from tfhash.evaluation_report import REQUIRED_ARRAYS

    result = CliRunner().invoke(main, ["evaluate", "--help"])
    assert result.exit_code == 0, result.output
    for name in REQUIRED_ARRAYS:
        assert f"  {name}  " in result.output  # one line of the list each
    for form in ("+-1 codes", "packed uint8", "class ids", "multi-hot"):
        assert form in result.output


def test_evaluate_writes_metrics_and_plots(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 60)
    codes = np.where(rng.random((60, 16)) < 0.5, -1, 1).astype(np.int8)
    codes[:, 0] = np.where(labels == 0, 1, -1)
    path = tmp_path / "codes.npz"
    np.savez(path, query_codes=codes[:10], db_codes=codes[10:], query_labels=labels[:10], db_labels=labels[10:])
    result = CliRunner().invoke(main, ["evaluate", str(path), "--output-dir", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert 0.0 <= written["metrics"]["mAP@all"] <= 1.0
    for png in ("pr_curve.png", "precision_at_n.png", "tsne.png", "gallery.png"):
        assert (tmp_path / "out" / png).read_bytes()[:4] == b"\x89PNG"
    page = (tmp_path / "out" / "gallery.html").read_text()  # feature vectors: labels only, two queries of each class
    assert page.count('<figure class="query"') == 6 and "<img" not in page and page.count("<figure") == 6 * 11
    images = rng.integers(0, 255, (60, 8, 8), dtype=np.uint8)
    np.savez(path, query_codes=codes[:10], db_codes=codes[10:], query_labels=labels[:10], db_labels=labels[10:],
             query_images=images[:10], db_images=images[10:])
    assert CliRunner().invoke(main, ["evaluate", str(path), "--output-dir", str(tmp_path / "pictures"), "--no-tsne"]).exit_code == 0
    page = (tmp_path / "pictures" / "gallery.html").read_text()
    assert page.count("<img") == 6 * 11  # the same seeded queries, now with their pictures
    shown = re.compile(r'<figure class="(query|right|wrong)" data-id="(\d+)"')
    assert shown.findall(page) == shown.findall((tmp_path / "out" / "gallery.html").read_text())


def test_evaluate_refuses_bad_files(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz")
    result = CliRunner().invoke(main, ["evaluate", str(bad), "--output-dir", str(tmp_path / "o")])
    assert result.exit_code == 2 and result.output.startswith(f"Error: {bad}: not a readable .npz"), result.output
    partial = tmp_path / "partial.npz"
    np.savez(partial, query_codes=np.ones((2, 8), np.int8))
    result = CliRunner().invoke(main, ["evaluate", str(partial), "--output-dir", str(tmp_path / "o")])
    assert result.exit_code == 2 and result.output.startswith(f"Error: {partial}: missing arrays"), result.output


def test_missing_data_root_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["data", "info", "mnist", "--data-root", str(tmp_path)])
    assert result.exit_code == 2 and result.output.startswith("Error: dataset file") and "looked for" in result.output


def test_every_command_reports_bad_input_alike(tmp_path):
    """The data, index, pipeline and serve commands print a refused input as click does its usage
    errors: ``Error: <message>`` and exit code 2."""
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "bits.json").write_text(json.dumps({"name": "x", "run_dir": "gs://bucket/run", "training": {"bits": 30}}))
    (tmp_path / "empty").mkdir()
    commands = {
        "data": (["data", "export-user", "--features", "nopath", "--output", str(tmp_path / "o")], "takes NAME=PATH"),
        "index": (["index", "info", str(tmp_path / "empty")], "no manifest.json"),
        "pipeline": (["pipeline", "compile", "--config", str(tmp_path / "bits.json"), "--output", str(tmp_path / "p.json")],
                     check_bits_message(30)),
        "serve": (["serve", "config", "--config", str(tmp_path / "broken.json")], "cannot read the pipeline config"),
        "serve search": (["serve", "search", "--index-base-dir", str(tmp_path / "empty"), "--model-base-dir", str(tmp_path / "empty"),
                          "--event-loop", "tokio"], "event loop 'tokio' is none of auto, uvloop, asyncio"),
    }  # fmt: skip
    for group, (args, message) in commands.items():
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, (group, result.output)
        error = [line for line in result.output.splitlines() if "rror" in line]
        assert len(error) == 1 and error[0].startswith("Error: ") and message in error[0], (group, result.output)


def test_quickstart_refuses_a_code_length_before_loading_anything(tmp_path):
    """``--bits 30`` fits the option's range but no packed code: refused while the options are
    parsed, with check_bits's message, before the data (here: none) or the model."""
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["quickstart", "--bits", "30", "--data-root", str(tmp_path), "--output-dir", str(out)])
    assert result.exit_code == 2, result.output
    assert f"Error: Invalid value for '--bits': {check_bits_message(30)}" in result.output
    assert "SCDH" not in result.output and not out.exists()  # no banner: the command never started


def test_quickstart_end_to_end_on_mnist(tmp_path):
    """README command 1 in small: one epoch at 16 bits on the real MNIST files."""
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["quickstart", "--bits", "16", "--epochs", "1", "--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    assert "mAP@all:" in result.output.splitlines()[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"]["split"]["train"] == 5000 and summary["seed"] == 0
    assert summary["mAP@all"] > 0.5  # one epoch already separates digits far above chance (0.1)
    with np.load(out / "codes.npz") as codes:
        assert codes["db_codes"].shape == (69000, 2)
        query_codes = codes["query_codes"]
    model_path = out / "model.keras"
    assert summary["model_path"] == str(model_path) and f"model written to {model_path}" in result.output
    import keras

    import tfhash.models  # noqa: F401  # registers the model classes that load_model rebuilds
    from tfhash.codes import pack_codes
    from tfhash.data import load_mnist

    restored = keras.saving.load_model(model_path)
    queries, _ = load_mnist(seed=0).part("query")
    np.testing.assert_array_equal(pack_codes(restored.encode(queries["image"])), query_codes)  # the same batches of 512


def test_index_build_search_info(tmp_path):
    rng = np.random.default_rng(1)
    db = rng.choice(np.array([-1, 1], np.int8), size=(300, 32))
    np.savez(tmp_path / "codes.npz", db_codes=db, query_codes=db[:3], db_ids=np.arange(300) + 1000)
    runner = CliRunner()
    out = tmp_path / "idx"
    built = runner.invoke(main, ["index", "build", str(tmp_path / "codes.npz"), "--ids-array", "db_ids",
                                 "--output", str(out), "--model-version", "4", "--batch-size", "100"])  # fmt: skip
    assert built.exit_code == 0, built.output
    found = runner.invoke(main, ["index", "search", str(out), "--queries", str(tmp_path / "codes.npz"), "-k", "2",
                                 "--expected-model-version", "4"])  # fmt: skip
    assert found.exit_code == 0, found.output
    first = json.loads(found.output.splitlines()[0])
    assert first["ids"][0] == 1000 and first["distances"][0] == 0
    shown = runner.invoke(main, ["index", "info", str(out)])
    assert json.loads(shown.output)["model"]["version"] == "4"
    wrong = runner.invoke(main, ["index", "search", str(out), "--queries", str(tmp_path / "codes.npz"), "-k", "301"])
    assert wrong.exit_code == 2 and wrong.output.startswith("Error: ") and "larger than the 300 items" in wrong.output
    stale = runner.invoke(main, ["index", "search", str(out), "--queries", str(tmp_path / "codes.npz"),
                                 "--expected-model-version", "5"])  # fmt: skip
    assert stale.exit_code == 2 and stale.output.startswith("Error: ") and "model version" in stale.output
    unchecked = runner.invoke(main, ["index", "search", str(out), "--queries", str(tmp_path / "codes.npz"),
                                     "--expected-signature-fingerprint", "abc"])  # fmt: skip
    assert unchecked.exit_code == 2 and "records no SavedModel signature fingerprint" in unchecked.output
    plain = runner.invoke(main, ["index", "search", str(out), "--queries", str(tmp_path / "codes.npz"), "--embeddings-array", "query_codes"])
    assert plain.exit_code == 2 and "stores no embeddings; build it with --embeddings-array" in plain.output


def test_index_build_and_search_with_the_second_stage(tmp_path):
    rng = np.random.default_rng(3)
    continuous = rng.normal(size=(400, 32)).astype(np.float32)
    continuous[:200] = np.abs(continuous[:200])  # half of the items on one code
    np.savez(tmp_path / "codes.npz", db_codes=np.where(continuous >= 0, 1, -1).astype(np.int8), db_values=continuous,
             query_values=continuous[:200:20])  # fmt: skip
    runner, out = CliRunner(), tmp_path / "idx"
    built = runner.invoke(main, ["index", "build", str(tmp_path / "codes.npz"), "--output", str(out), "--embeddings-array", "db_values"])
    assert built.exit_code == 0, built.output
    assert json.loads(runner.invoke(main, ["index", "info", str(out)]).output)["embeddings"]["count"] == 400
    found = runner.invoke(main, ["index", "search", str(out), "--queries", str(tmp_path / "codes.npz"), "--embeddings-array",
                                 "query_values", "-k", "3", "--k-factor", "2"])  # fmt: skip
    assert found.exit_code == 0, found.output
    assert [json.loads(line)["ids"][0] for line in found.output.splitlines()] == list(range(0, 200, 20))  # each item first
    bad = runner.invoke(main, ["index", "build", str(tmp_path / "codes.npz"), "--output", str(tmp_path / "bad"), "--embeddings-array", "db_codes",
                               "--ids-array", "nothing"])  # fmt: skip
    assert bad.exit_code == 2 and "has no array 'nothing'" in bad.output


def test_index_verify_checks_every_index_of_a_version_and_its_model_lock(tmp_path):
    """``tfhash index verify``: every index of a version directory verified (one JSON line each),
    a flipped byte named with its file and exit 2, and with --model-dir the lock to that model."""
    import shutil

    import tensorflow as tf

    from tfhash.artifacts import signature_fingerprint

    module = tf.Module()
    module.f = tf.function(lambda x: x + 1.0, input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "models" / "4"))
    shutil.copytree(tmp_path / "models" / "4", tmp_path / "models" / "5")
    fingerprint = signature_fingerprint(str(tmp_path / "models" / "4"))
    rng = np.random.default_rng(5)
    np.savez(tmp_path / "codes.npz", db_codes=rng.choice(np.array([-1, 1], np.int8), size=(300, 32)))
    runner, version = CliRunner(), tmp_path / "indexes" / "4"
    for kind in ("BFlat", "BFlat-text"):
        built = runner.invoke(main, ["index", "build", str(tmp_path / "codes.npz"), "--output", str(version / kind), "--model-version", "4",
                                     "--signature-fingerprint", fingerprint])  # fmt: skip
        assert built.exit_code == 0, built.output
    good = runner.invoke(main, ["index", "verify", str(version), "--model-dir", str(tmp_path / "models" / "4")])
    assert good.exit_code == 0, good.output
    lines = [json.loads(line) for line in good.output.splitlines()]
    assert [(line["index"].rsplit("/", 1)[1], line["ok"], line["count"]) for line in lines] == [("BFlat", True, 300), ("BFlat-text", True, 300)]
    other = runner.invoke(main, ["index", "verify", str(version / "BFlat"), "--model-dir", str(tmp_path / "models" / "5")])
    assert other.exit_code == 2 and "model version" in json.loads(other.output.splitlines()[0])["error"]
    codes = version / "BFlat-text" / "codes.npy"
    data = bytearray(codes.read_bytes())
    data[-1] ^= 0x01  # one flipped bit in the last code
    codes.write_bytes(bytes(data))
    damaged = runner.invoke(main, ["index", "verify", str(version)])
    assert damaged.exit_code == 2 and "1 of 2 indexes" in damaged.output
    first, second = (json.loads(line) for line in damaged.output.splitlines()[:2])
    assert first["ok"] and not second["ok"] and "checksum mismatch for codes.npy" in second["error"]
    missing = runner.invoke(main, ["index", "verify", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "no such directory" in missing.output


@pytest.mark.process
def test_index_build_and_search_in_milvus(tmp_path):
    import pymilvus  # noqa: F401  # imported here first: its log handler keeps the stderr of its first import, which CliRunner closes

    rng = np.random.default_rng(2)
    db = rng.choice(np.array([-1, 1], np.int8), size=(200, 32))
    np.savez(tmp_path / "codes.npz", db_codes=db, query_codes=db[:2])
    runner = CliRunner()
    out, lite = tmp_path / "idx", str(tmp_path / "milvus.db")
    missing = runner.invoke(main, ["index", "build", str(tmp_path / "codes.npz"), "--kind", "Milvus", "--output", str(out)])
    assert missing.exit_code == 2 and missing.output.startswith("Error: ") and "needs uri=" in missing.output
    built = runner.invoke(main, ["index", "build", str(tmp_path / "codes.npz"), "--kind", "Milvus", "--uri", lite,
                                 "--collection", "codes_v4", "--output", str(out), "--model-version", "4"])  # fmt: skip
    assert built.exit_code == 0, built.output
    shown = json.loads(runner.invoke(main, ["index", "info", str(out)]).output)
    assert shown["kind"] == "milvus-flat" and shown["params"]["collection"] == "codes_v4" and shown["count"] == 200
    found = runner.invoke(main, ["index", "search", str(out), "--queries", str(tmp_path / "codes.npz"), "-k", "1",
                                 "--expected-model-version", "4"])  # fmt: skip
    assert found.exit_code == 0, found.output
    assert [json.loads(line)["distances"] for line in found.output.splitlines()] == [[0], [0]]


#: A line of TensorFlow's C++ log ("2024-01-01 10:00:00.123456: E external/...cuda_fft.cc:...]").
TF_CPP_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] ", re.MULTILINE)


def output_then_heavy_modules(code: str) -> list[str]:
    """Run ``code`` in a fresh Python and return the lines it printed, then a last line naming the
    heavy frameworks (TensorFlow, TFX, Keras) the process holds after it."""
    code += "; print(sorted({'tensorflow', 'tfx', 'keras'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


@pytest.mark.process
def test_the_command_line_imports_tensorflow_only_inside_commands():
    """``TF_CPP_MIN_LOG_LEVEL`` works only when set before TensorFlow's first import: the entry
    point sets it in its group callback, so importing the command line must not import TensorFlow."""
    assert output_then_heavy_modules("import sys, tfhash.cli") == ["[]"]


@pytest.mark.process
def test_tfhash_methods_lists_the_methods_without_tensorflow():
    """``tfhash methods`` reads :mod:`tfhash.registry`, which imports no TensorFlow: it starts as
    fast as ``tfhash --help`` (importing TensorFlow made it take seconds)."""
    lines = output_then_heavy_modules("import sys; from tfhash.cli import main; main(['methods'], standalone_mode=False)")
    assert lines[0].startswith("scdh ") and lines[-1] == "[]", lines


@pytest.mark.process
def test_console_is_quiet_by_default_and_full_with_verbose(tmp_path):
    """A command that imports TensorFlow and TFX (compiling a pipeline) writes nothing to stderr
    by default: no TensorFlow C++ log (CUDA plugin registration, TensorRT, CPU features), no
    third-party FutureWarnings; ``-v`` is accepted and brings that log back."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "metadata.json").write_text(json.dumps({"num_classes": 10, "modalities": {"image": {"kind": "image", "shape": [28, 28]}}}))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"name": "console", "data_dir": str(data), "run_dir": "gs://tfhash-console/run"}))
    env = {key: value for key, value in os.environ.items() if key not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONWARNINGS")}

    def compile_(*flags: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "tfhash.cli", *flags, "pipeline", "compile", "--config", str(config),
                   "--output", str(tmp_path / "pipeline.json")]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)

    quiet = compile_()
    assert quiet.returncode == 0, quiet.stderr
    assert not TF_CPP_LOG_LINE.search(quiet.stderr) and "Warning" not in quiet.stderr, quiet.stderr
    assert quiet.stdout.strip() == str(tmp_path / "pipeline.json")
    verbose = compile_("-v")
    assert verbose.returncode == 0, verbose.stderr
    assert TF_CPP_LOG_LINE.search(verbose.stderr) or "FutureWarning" in verbose.stderr, verbose.stderr


@pytest.mark.process
def test_importing_tfhash_prints_nothing_unless_asked():
    """Plain Python use: importing the modules that load TensorFlow, Keras and TFX writes nothing to
    stderr (no C++ log, no google FutureWarnings); a level or ``-W`` option the user sets wins."""
    env = {key: value for key, value in os.environ.items() if key not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONWARNINGS")}
    code = "import os, tfhash.models, tfhash.pipelines.config, tfhash.components.trainer; print(os.environ['TF_CPP_MIN_LOG_LEVEL'])"

    def run(*options: str, **extra: str) -> subprocess.CompletedProcess:
        result = subprocess.run([sys.executable, *options, "-c", code], capture_output=True, text=True, env={**env, **extra}, timeout=300)
        assert result.returncode == 0, result.stderr
        return result

    quiet = run()
    assert quiet.stderr == "" and quiet.stdout == "3\n"
    asked = run("-W", "default::FutureWarning", TF_CPP_MIN_LOG_LEVEL="0")
    assert asked.stdout == "0\n" and (TF_CPP_LOG_LINE.search(asked.stderr) or "FutureWarning" in asked.stderr), asked.stderr


def test_pipeline_progress_is_one_line_per_component():
    from tfhash.console import PipelineProgress

    stream = io.StringIO()
    progress = PipelineProgress(stream)

    def passes(message: str, level: int = logging.INFO) -> bool:
        return progress.filter(logging.LogRecord("absl", level, __file__, 1, message, None, None))

    shown = [passes(message) for message in ("Component Trainer is running.", "Going to run a new execution 7",
                                             "Component Trainer is finished.", "Component Pusher is running.",
                                             "A cached execution 9 is used.", "Component Pusher is finished.")]  # fmt: skip
    assert not any(shown)  # every INFO record is consumed
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("[tfhash] Trainer") and lines[0].endswith(" s")
    assert lines[1].startswith("[tfhash] Pusher") and lines[1].endswith("(cached)")
    assert not passes("ArtifactQuery.property_predicate is not supported.", logging.WARNING)
    assert passes("Something else went wrong.", logging.WARNING) and passes("Failed.", logging.ERROR)
