"""The TFX pipeline around one small real local run of MNIST (LocalDagRunner, Beam in memory) that
several tests read (its outputs, its ML Metadata, its artifacts served), the same run on the
multi-process direct runner, the config, and the multi-worker chief logic. The
other datasets' runs: test_pipeline_runs.py."""

from __future__ import annotations

import dataclasses
import json
import os

import keras
import numpy as np
import pytest
from tfhash.components import trainer
from tfhash.pipelines.config import PipelineConfig

from tests import browser
from tests.pipeline_fixtures import small_config
from tests.tiers import starts
from tfhash.training_spec import TrainingSpec


@pytest.fixture(scope="session")
@starts("beam", "process")
def small_pipeline_run(tmp_path_factory):
    """One real local run of the MNIST pipeline (LocalDagRunner, Beam in memory): SCDH trained with
    the JCCH coefficients computed by Transform (50 anchors), on exported data with three bad
    records added (policy "drop"), indexed by BFlat and by Milvus (the run's Milvus Lite file).
    Returns ``(config, summary)``."""
    import tensorflow as tf
    from tfhash.pipelines.runner import export_data, run_local

    from tfhash.cli import write_serving_config

    root = tmp_path_factory.mktemp("pipeline")
    config = small_config(root, jcch_anchors=50, bad_records="drop", index_kinds=["BFlat", "Milvus"],
                          training={"method": "scdh", "bits": 16, "epochs": 3, "batch_size": 64, "label_coefficients": True})  # fmt: skip
    export_data(config, log=lambda message: None)
    image = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"not a png"]))
    no_label = tf.train.Example(features=tf.train.Features(feature={
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[10**6])), "image": image}))  # fmt: skip
    for split, records in {"train": [no_label.SerializeToString(), b"garbage"], "query": [b"\xff\xfe not a proto"]}.items():
        with tf.io.TFRecordWriter(f"{config.layout.data}/{split}/zz-bad.tfrecord.gz", options="GZIP") as writer:
            for record in records:
                writer.write(record)
    return config, run_local(config, log=lambda message: None, after_push=write_serving_config)


def test_small_pipeline_end_to_end(small_pipeline_run):
    from tfhash.index import load_index

    config, summary = small_pipeline_run
    assert summary["blessed"] is True and summary["metrics"]["queries"] == 400
    assert summary["metrics"]["mAP@all"] > 0.2  # 3 epochs on 400 digits already beat chance (0.1)
    bad = summary["bad_records"]  # the fixture added 3 bad records; policy "drop"
    assert bad["bad_records"] == 3 and bad["policy"] == "drop"
    assert bad["by_split"] == {"train": {"missing label": 1, "unparsable record": 1}, "query": {"unparsable record": 1},
                               "database": {}}  # fmt: skip
    version = summary["model_version"]
    index = load_index(summary["indexes"]["BFlat"], expected_model_version=version)
    assert index.ntotal == 400
    milvus = load_index(summary["indexes"]["Milvus"], expected_model_version=version)
    assert milvus.ntotal == 400 and milvus.uri == config.layout.milvus_lite and milvus.collection == f"tiny_mnist_v{version}"
    milvus.close()
    example = summary["example_query"]  # the first query, answered by both indexes alike
    assert set(example["answers"]) == {"BFlat", "Milvus"} and example["same_distances"]
    gallery = open(summary["gallery"]).read()  # two seeded queries of each digit, with their 10 nearest digits as pictures
    assert gallery.count('<figure class="query"') == 20 and gallery.count("<img") == 20 * 11 and "chosen with seed 0" in gallery
    with open(os.path.join(os.path.dirname(summary["gallery"]), "gallery.png"), "rb") as picture:
        assert picture.read(8) == b"\x89PNG\r\n\x1a\n"
    warmup = os.path.join(config.run_dir, "serving", "tiny-mnist", version, "assets.extra", "tf_serving_warmup_requests")
    assert os.path.isfile(warmup)
    assert os.path.isfile(os.path.join(config.run_dir, "summary.json"))
    assert os.path.isfile(os.path.join(summary["tf_serving_config"], "models.config"))
    # the exported signature takes serialized raw examples without labels
    import tensorflow as tf

    loaded = tf.saved_model.load(summary["model_dir"])
    assert set(loaded.signatures) == {"serving_default", "encode_features", "encode_pixels"}  # an image model


@pytest.mark.process
@browser.SKIP
def test_the_runs_gallery_in_a_browser(small_pipeline_run, tmp_path):
    """The gallery the run's summary names, opened in headless Chromium: every query and neighbour
    shows its picture, and the framed neighbours are those sharing no class with their query."""
    import re

    from selenium.webdriver.common.by import By

    _, summary = small_pipeline_run
    driver = browser.chromium(tmp_path / "profile")
    try:
        driver.get("file://" + summary["gallery"])
        rows = driver.find_elements(By.CSS_SELECTOR, ".row")
        assert len(rows) == 20
        images = driver.find_elements(By.CSS_SELECTOR, "figure img")
        assert len(images) == 20 * 11 and all(driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", i)
                                              for i in images)  # fmt: skip
        for row in rows:
            query, *found = row.find_elements(By.TAG_NAME, "figure")
            classes = set(re.search(r": (.*)\n", query.text).group(1).split(", "))
            for figure in found:
                theirs = set(re.search(r": (.*)\n", figure.text).group(1).split(", "))
                assert ("wrong" in figure.get_attribute("class")) == (not classes & theirs), figure.text
    finally:
        driver.quit()


def _transformed_records(config) -> dict:
    """Every transformed record of a run's Transform, by split and id (feature maps)."""
    import glob

    import tensorflow as tf

    records = {}
    for path in glob.glob(os.path.join(config.layout.pipeline_root, "Transform", "transformed_examples", "*", "Split-*", "*")):
        split = os.path.basename(os.path.dirname(path))
        for raw in tf.data.TFRecordDataset(path, compression_type="GZIP"):
            example = tf.train.Example.FromString(raw.numpy())
            key = (split, example.features.feature["id"].int64_list.value[0])
            records[key] = {name: feature.SerializeToString(deterministic=True) for name, feature in example.features.feature.items()}
    return records


@pytest.mark.beam
@pytest.mark.process
def test_beam_components_on_the_multi_process_runner(small_pipeline_run, tmp_path):
    """The same run with Beam's direct runner in multi-process mode (2 worker processes per Beam
    job): worker processes do the work, and the Beam components give the same answers as in
    memory (RecordFilter's counts, every record Transform writes with its JCCH coefficients)."""
    import shutil
    import threading
    import time

    import psutil
    from tfhash.pipelines.runner import run_local

    in_memory, expected = small_pipeline_run
    config = small_config(tmp_path, jcch_anchors=50, bad_records="drop",
                          beam_args=["--direct_running_mode=multi_processing", "--direct_num_workers=2"], map_threshold=0.0,
                          training={"method": "scdh", "bits": 16, "epochs": 1, "batch_size": 64, "label_coefficients": True})  # fmt: skip
    # one epoch: the Trainer is no Beam component; what is compared does not depend on training
    shutil.copytree(in_memory.layout.data, config.layout.data)  # the same records, bad ones included
    workers, running = set(), [True]

    def watch():  # Beam's worker processes are children of this process
        while running[0]:
            for child in psutil.Process().children(recursive=True):
                try:
                    if "sdk_worker_main" in " ".join(child.cmdline()):
                        workers.add(child.pid)
                except psutil.Error:
                    pass
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        summary = run_local(config, log=lambda message: None)
    finally:
        running[0] = False
        watcher.join()
    assert len(workers) >= 2
    assert summary["bad_records"]["by_split"] == expected["bad_records"]["by_split"]
    assert summary["metrics"]["database"] == expected["metrics"]["database"] and summary["blessed"]
    records = _transformed_records(config)
    assert len(records) == 1200 and records == _transformed_records(in_memory)


def test_summary_reads_the_run_from_ml_metadata(small_pipeline_run):
    """The summary is the run's own: newer output files of another execution under the pipeline
    root (what a concurrent run, or a run after a cached one, leaves there) do not change it."""
    import shutil

    from tfhash.pipelines.runner import summarise

    config, summary = small_pipeline_run
    decoys = {("RetrievalEvaluator", "evaluation", "metrics.json"): {"metrics": {"mAP@all": 0.01}, "blessed": False},
              ("RecordFilter", "report", "report.json"): {"bad_records": 99},
              ("IndexBuilder", "index", "indexes.json"): {"model_version": "1", "model_dir": "/elsewhere", "indexes": {}}}  # fmt: skip
    folders = []
    try:
        for (node, key, name), content in decoys.items():
            folders.append(os.path.join(config.layout.pipeline_root, node, key, "999999"))
            os.makedirs(folders[-1])
            with open(os.path.join(folders[-1], name), "w") as handle:
                json.dump(content, handle)
        again = summarise(config)
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    for key in ("metrics", "blessed", "blessing_reason", "model_version", "model_dir", "indexes", "bad_records", "example_query"):
        assert again[key] == summary[key], key


def test_summary_follows_one_run_in_ml_metadata(tmp_path):
    """``summarise`` takes the outputs that ML Metadata links to one run's executions: a cached
    execution's are the earlier run's artifacts it reused; another pipeline's runs in the same
    store, and failed executions, do not count."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2 as mlmd
    from tfhash.pipelines.runner import summarise

    config = small_config(tmp_path, name="tiny")
    os.makedirs(config.layout.run_dir)
    connection = mlmd.ConnectionConfig()
    connection.sqlite.filename_uri = config.layout.metadata
    store = metadata_store.MetadataStore(connection)
    context_types = {kind: store.put_context_type(mlmd.ContextType(name=kind)) for kind in ("pipeline", "pipeline_run", "node")}
    execution_type = store.put_execution_type(mlmd.ExecutionType(name="component"))
    artifact_type = store.put_artifact_type(mlmd.ArtifactType(name="artifact"))
    contexts = {}

    def context(kind: str, name: str) -> int:
        if (kind, name) not in contexts:
            contexts[kind, name] = store.put_contexts([mlmd.Context(type_id=context_types[kind], name=name)])[0]
        return contexts[kind, name]

    def artifact(name: str, file: str | None = None, content=None, **properties) -> int:
        folder = tmp_path / "artifacts" / name
        folder.mkdir(parents=True)
        if file:
            (folder / file).write_text(json.dumps(content))
        record = mlmd.Artifact(type_id=artifact_type, uri=str(folder))
        for key, value in properties.items():
            setattr(record.custom_properties[key], "int_value" if isinstance(value, int) else "string_value", value)
        return store.put_artifacts([record])[0]

    def execute(pipeline: str, run: str, node: str, outputs: dict, state=mlmd.Execution.COMPLETE) -> None:
        [execution] = store.put_executions([mlmd.Execution(type_id=execution_type, last_known_state=state)])
        events = []
        for key, artifact_id in outputs.items():
            event = mlmd.Event(artifact_id=artifact_id, execution_id=execution, type=mlmd.Event.OUTPUT)
            event.path.steps.add().key = key
            event.path.steps.add().index = 0
            events.append(event)
        store.put_events(events)
        ids = [context("pipeline", pipeline), context("pipeline_run", run), context("node", f"{pipeline}.{node}")]
        store.put_attributions_and_associations([], [mlmd.Association(context_id=i, execution_id=execution) for i in ids])

    report = artifact("report-1", "report.json", {"bad_records": 3})
    execute("tiny", "run-1", "RecordFilter", {"report": report})
    execute("tiny", "run-1", "RetrievalEvaluator",
            {"evaluation": artifact("evaluation-1", "metrics.json", {"metrics": {"mAP@all": 0.9}, "blessed": True})})
    execute("tiny", "run-1", "Pusher", {"pushed_model": artifact("pushed-1", pushed=1, pushed_version="7", pushed_destination="/serving/7")})
    execute("tiny", "run-1", "IndexBuilder",
            {"index": artifact("index-1", "indexes.json", {"model_version": "7", "model_dir": "/serving/7", "indexes": {}})})
    execute("tiny", "run-2", "RecordFilter", {"report": report}, mlmd.Execution.CACHED)
    execute("tiny", "run-2", "RetrievalEvaluator",
            {"evaluation": artifact("evaluation-2", "metrics.json", {"metrics": {"mAP@all": 0.5}, "blessed": False})})
    execute("tiny", "run-2", "Pusher", {"pushed_model": artifact("pushed-2", pushed=0)})
    execute("tiny", "run-2", "IndexBuilder", {"index": artifact("index-2")})
    execute("tiny", "run-2", "RetrievalEvaluator",
            {"evaluation": artifact("evaluation-x", "metrics.json", {"metrics": {"mAP@all": 0.0}})}, mlmd.Execution.FAILED)
    execute("other", "run-3", "RetrievalEvaluator",
            {"evaluation": artifact("evaluation-3", "metrics.json", {"metrics": {"mAP@all": 0.1}, "blessed": True})})

    latest = summarise(config)  # run-2: the newest run of pipeline "tiny"
    assert latest["metrics"] == {"mAP@all": 0.5} and latest["blessed"] is False
    assert latest["bad_records"] == {"bad_records": 3}  # from the cached execution's reused artifact
    assert (latest["model_version"], latest["model_dir"], latest["indexes"]) == (None, None, None)  # not pushed
    first = summarise(config, "run-1")
    assert first["metrics"] == {"mAP@all": 0.9} and first["blessed"] is True
    assert (first["model_version"], first["model_dir"], first["indexes"]) == ("7", "/serving/7", {})
    assert summarise(config, "run-3")["metrics"] is None  # another pipeline's run
    assert summarise(config, "no such run")["metrics"] is None


@pytest.mark.parametrize(
    "tf_config, chief, multi",
    [
        ({}, True, False),
        ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}, True, True),
        ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}, False, True),
        ({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}, False, True),
        ({"cluster": {"chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}, True, True),
    ],
)
def test_export_only_on_the_chief(monkeypatch, tmp_path, tf_config, chief, multi):
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert trainer.is_chief() is chief and trainer.is_multi_worker() is multi
    target = str(tmp_path / "serving")
    exported = trainer.export_directory(target)
    assert (exported == target) is chief


def test_trainer_targets_carry_label_coefficients():
    import tensorflow as tf

    features = {"labels": tf.ones([2, 3]), "jcch_q": tf.fill([2, 3], 0.5), "jcch_u": tf.fill([2, 3], 2.0)}
    assert trainer.targets(features, False) is features["labels"]
    with_coefficients = trainer.targets(features, True)
    assert set(with_coefficients) == {"labels", "q", "u"}
    assert float(with_coefficients["u"][0, 0]) == 2.0


@pytest.mark.process
def test_a_second_run_on_one_run_directory_is_refused_until_the_first_ends(tmp_path):
    """``tfhash pipeline run`` holds its run directory: a second run on it exits 2 naming the
    holder, before any work; the lock goes with the holding process, even killed (no stale lock)."""
    import signal
    import subprocess
    import sys

    from tfhash.pipelines.runner import RunDirectoryInUse, run_lock

    config = small_config(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom tfhash.pipelines.config import PipelineConfig\n"
                               "from tfhash.pipelines.runner import run_lock\nwith run_lock(PipelineConfig.load(sys.argv[1]).layout):\n"
                               "    print('held', flush=True)\n    time.sleep(600)\n", str(tmp_path / "config.json")],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirectoryInUse, match=rf"{config.layout.run_dir} is in use by another `tfhash pipeline run` \(pid {holder.pid}, started"):
            with run_lock(config.layout):
                pass
        command = subprocess.run([sys.executable, "-m", "tfhash.cli", "pipeline", "run", "--config", str(tmp_path / "config.json")],
                                 capture_output=True, text=True, timeout=300)  # fmt: skip
        assert command.returncode == 2 and f"pid {holder.pid}" in command.stderr and "another run_dir" in command.stderr
        assert not os.path.exists(config.layout.data)  # refused before exporting anything
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with run_lock(config.layout):  # free again once the holder is gone
        pass


def test_config_errors_are_clear(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "x", "trainig": {}}))
    with pytest.raises(ValueError, match="unknown setting 'trainig': did you mean 'training'"):
        PipelineConfig.load(path)
    path.write_text(json.dumps({"name": "x", "training": {"method": "dsph"}}))
    with pytest.raises(ValueError, match="unknown method 'dsph'.*did you mean 'dpsh'"):
        PipelineConfig.load(path)
    path.write_text(json.dumps({"name": "x", "training": {"method": "dpsh"}}))
    with pytest.raises(ValueError, match="training.method 'dpsh': the pipeline trains"):
        PipelineConfig.load(path)
    path.write_text(json.dumps({"name": "x", "training": {"label_coefficients": True}}))
    with pytest.raises(ValueError, match="jcch_anchors"):
        PipelineConfig.load(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="cannot read"):
        PipelineConfig.load(path)
    path.write_text(json.dumps({"name": "x", "training": {"method": "jcch"}}))
    with pytest.raises(ValueError, match="two modality names"):
        PipelineConfig.load(path)
    path.write_text(json.dumps({"name": "x", "modalities": ["image", "text"]}))
    with pytest.raises(ValueError, match="only for the cross-modal methods"):
        PipelineConfig.load(path)
    path.write_text(json.dumps({"name": "x", "bad_records": "ignore"}))
    with pytest.raises(ValueError, match="bad_records"):
        PipelineConfig.load(path)
    path.write_text(json.dumps({"name": "x", "index_kinds": ["BFlat", "Milvsu"]}))
    with pytest.raises(ValueError, match="unknown index type 'Milvsu'; use BFlat"):
        PipelineConfig.load(path)
    path.write_text(json.dumps({"name": "x", "index_kinds": []}))
    with pytest.raises(ValueError, match="index_kinds is empty"):
        PipelineConfig.load(path)
    path.write_text(json.dumps({"name": "x", "index_kinds": "BFlat"}))
    with pytest.raises(ValueError, match=r"index_kinds must be a list of index type names, e\.g\. \["):
        PipelineConfig.load(path)
    for uri in (19530, "", " "):
        path.write_text(json.dumps({"name": "x", "index_kinds": ["Milvus"], "milvus_uri": uri}))
        with pytest.raises(ValueError, match="milvus_uri must be a Milvus server address"):
            PipelineConfig.load(path)


def test_milvus_uri_defaults_to_the_runs_lite_file_and_resolves_like_paths(tmp_path):
    path = tmp_path / "configs" / "run.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"name": "x", "run_dir": "runs", "index_kinds": ["Milvus"]}))
    assert PipelineConfig.load(path).milvus == str(tmp_path / "configs" / "runs" / "milvus" / "x.db")
    path.write_text(json.dumps({"name": "x", "milvus_uri": "../lite/indexes.db"}))
    assert PipelineConfig.load(path).milvus == str(tmp_path / "lite" / "indexes.db")
    path.write_text(json.dumps({"name": "x", "milvus_uri": "http://milvus.retrieval:19530"}))
    assert PipelineConfig.load(path).milvus == "http://milvus.retrieval:19530"  # a server URI is kept as written


def test_an_unreachable_milvus_stops_the_run_before_any_work(tmp_path):
    """The run checks the Milvus its index goes to first: a clear error, no data exported, no training."""
    import socket

    import pymilvus  # noqa: F401  # imported here first: its log handler keeps the stderr of its first import, which CliRunner closes
    from click.testing import CliRunner

    from tfhash.cli import main

    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{probe.getsockname()[1]}"
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"name": "x", "run_dir": "runs", "index_kinds": ["BFlat", "Milvus"], "milvus_uri": uri}))
    result = CliRunner().invoke(main, ["pipeline", "run", "--config", str(path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"Error: cannot reach Milvus at {uri} within 10 s" in result.output and "check that the server runs" in result.output
    assert not (tmp_path / "runs").exists()  # nothing exported, nothing trained


def test_a_recipe_fills_the_training_section_under_its_own_keys():
    from tfhash.optimizers import compile_fine_tuning
    from tfhash.recipes import RECOMMENDED
    from tfhash.registry import build_model, make_backbone

    config = PipelineConfig(name="x", dataset="wiki", modalities=["image", "text"],
                            training={"recipe": "cross-modal", "bits": 16, "overrides": {"beta": 0.3},
                                      "fine_tuning": {"learning_rate": 2e-3}})  # fmt: skip
    recipe, training = RECOMMENDED["cross-modal"], config.training
    assert (training.method, training.hidden, training.epochs) == (recipe.method, list(recipe.hidden), recipe.epochs)
    assert training.overrides == {**recipe.options, "beta": 0.3} and training.bits == 16
    optimisation = training.fine_tuning
    assert optimisation.learning_rate == 2e-3 and optimisation.dropout == recipe.dropout
    assert PipelineConfig(**config.to_dict()).training == training  # expanding again changes nothing
    towers = {m: make_backbone(config.training, [8], f"tower_{m}", tower) for m, tower in config.training.towers(["image", "text"]).items()}
    dropouts = {m: [layer.rate for layer in t.layers if isinstance(layer, keras.layers.Dropout)] for m, t in towers.items()}
    assert dropouts == {"image": [0.2, 0.5, 0.5], "text": [0.5, 0.5]}  # input dropout on the image tower only
    hyp2 = PipelineConfig(name="x", modality="text", training={"recipe": "multi-label", "bits": 16}).training
    model = build_model(hyp2, {"text": [12]}, 5)
    assert (model.beta, model.pair_scope) == (4.0, "labelled")
    optimizer = compile_fine_tuning(model, hyp2.fine_tuning, epochs=2, steps_per_epoch=1)
    assert isinstance(optimizer, keras.optimizers.AdamW) and optimizer.weight_decay == RECOMMENDED["multi-label"].weight_decay
    rng = np.random.default_rng(0)
    tags = (rng.random((32, 5)) < 0.4).astype("float32")
    tags[np.arange(32), rng.integers(0, 5, 32)] = 1.0  # every row has a label
    history = model.fit(rng.normal(size=(32, 12)).astype("float32"), tags, epochs=2, batch_size=16, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    with pytest.raises(ValueError, match="unknown kind of data.*'single-label photos' for single-label images"):
        PipelineConfig(name="x", training={"recipe": "audio"})
    with pytest.raises(ValueError, match="'single-label photo' names an unknown kind.*'single-label photos' for single"):
        PipelineConfig(name="x", training={"recipe": "single-label photo"})
    with pytest.raises(ValueError, match="trains an MLP on feature vectors"):
        PipelineConfig(name="x", modality="text", training={"recipe": "multi-label", "backbone": "small_cnn"})
    for kind in ("single-label", "single-label pixels"):  # fixed feature vectors only; the pipeline's are images
        with pytest.raises(ValueError, match="is for fixed feature vectors"):
            PipelineConfig(name="x", training={"recipe": kind})
    with pytest.raises(ValueError, match="trains 'hyp2'; drop method 'scdh'"):
        PipelineConfig(name="x", modality="text", training={"recipe": "multi-label", "method": "scdh"})
    with pytest.raises(ValueError, match="training.recipe names the recommended recipe a section started from"):
        TrainingSpec(recipe="multi-label", backbone="small_cnn")
    wiki = {"name": "x", "dataset": "wiki", "modalities": ["image", "text"]}
    with pytest.raises(ValueError, match="input_dropout names the towers \\['imgae'\\]; the data's towers are"):
        PipelineConfig(**wiki, training={"recipe": "cross-modal", "fine_tuning": {"input_dropout": {"imgae": 0.2}}})
    decayed = PipelineConfig(**wiki, training={"recipe": "cross-modal", "fine_tuning": {"weight_decay": 0.01}}).training
    assert decayed.fine_tuning.weight_decay == 0.01  # the recipe's "auto" optimizer follows the decay: AdamW
    assert isinstance(decayed.fine_tuning.make_optimizer(1, 1), keras.optimizers.AdamW)
    centres = [build_model(dataclasses.replace(config.training, seed=seed), {"image": [8], "text": [4]}, 10).centres
               for seed in (0, 1)]  # fmt: skip
    assert not np.array_equal(*centres)  # the fixed centres follow the run's seed


@pytest.mark.parametrize("name", ["mnist", "cifar10", "cifar10-gpu", "mirflickr25k", "wiki"])
def test_shipped_configs_load(name):
    from importlib import resources

    config = PipelineConfig.load(str(resources.files("tfhash.pipelines") / "configs" / f"{name}.json"))
    assert config.dataset == name.removesuffix("-gpu") and config.inputs


@pytest.mark.server
def test_pipeline_artifacts_served_end_to_end(small_pipeline_run):
    """The MNIST pipeline's pushed model behind the development model server (with the generated
    models.local.config), the search service encoding through it: answers equal the library's."""
    import glob

    import tensorflow as tf
    from tfhash.serving.client import ModelClient
    from tfhash.serving.deployment import read_models_config
    from tfhash.serving.model_server import DevModelServer
    from tfhash.serving.search_client import SearchClient
    from tfhash.serving.search_service import SearchServer, remote_searcher

    from tests.serving_fixtures import graph_mode_outputs
    from tfhash.index import load_embeddings, load_index, refined_search

    config, summary = small_pipeline_run
    version = summary["model_version"]
    files = sorted(glob.glob(os.path.join(config.layout.data, "query", "*")))
    queries = [r.numpy() for r in tf.data.TFRecordDataset(files, compression_type="GZIP").take(16)]
    outputs = tf.saved_model.load(summary["model_dir"]).signatures["serving_default"](examples=tf.constant(queries))
    packed, continuous = outputs["packed_codes"].numpy(), outputs["codes"].numpy()
    expected = load_index(summary["indexes"]["BFlat"], expected_model_version=version).search(packed, 10)
    # the IndexBuilder stored the items' embeddings: the service answers with the second stage
    refined = refined_search(load_index(summary["indexes"]["BFlat"]), load_embeddings(summary["indexes"]["BFlat"]), continuous, 10)

    model_server = DevModelServer(read_models_config(os.path.join(summary["tf_serving_config"], "models.local.config"))).start()
    search_server = SearchServer(remote_searcher(model_server.address, config.name, config.layout.indexes,
                                                 model_base_dir=config.layout.serving)).start()  # fmt: skip
    # the graph-mode loader of tensorflow_model_server restores the Transform graph and the model too
    np.testing.assert_array_equal(graph_mode_outputs(summary["model_dir"], "serving_default", {"examples": np.array(queries, dtype=object)}), packed)
    try:
        with ModelClient(model_server.address, config.name, version=int(version)) as client:
            np.testing.assert_array_equal(client.encode_examples(queries).packed_codes, packed)
        with SearchClient(search_server.address) as client:
            answer = client.search(examples=queries, k=10)
            plain = client.search(examples=queries, k=10, refine=False)
        assert answer.model_version == version and answer.exact and answer.refined and not plain.refined
        np.testing.assert_array_equal(np.stack(answer.ids), refined.ids)
        np.testing.assert_array_equal(np.stack(answer.distances), refined.distances)
        np.testing.assert_array_equal(np.stack(plain.ids), expected.ids)
        np.testing.assert_array_equal(np.stack(plain.distances), expected.distances)
        # the same pipeline's Milvus index behind the same service: the same distances
        milvus_server = SearchServer(remote_searcher(model_server.address, config.name, config.layout.indexes, kind="Milvus",
                                                     model_base_dir=config.layout.serving)).start()  # fmt: skip
        try:
            with SearchClient(milvus_server.address) as client:
                from_milvus = client.search(examples=queries, k=10, refine=False)
        finally:
            milvus_server.stop(0)
        assert from_milvus.model_version == version and from_milvus.index_kind == "milvus-flat"
        np.testing.assert_array_equal(np.stack(from_milvus.distances), expected.distances)
    finally:
        search_server.stop(0)
        model_server.stop(0)
