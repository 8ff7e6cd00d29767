"""The path to a cluster, run here: MNIST exported to a Cloud Storage bucket, the pipeline run with
its run directory in the bucket, a search service answering from the model and index it reads
back, and the compiled Kubeflow spec run task by task through TFX's container entrypoint, as its
pods would; each ends with what the local runner gives on the same data and seed.

The bucket is the Cloud Storage API of gcp-storage-emulator on loopback, spoken to by TensorFlow's
and Beam's own clients (``tests/storage_emulator.py``); every command runs as a process, as a user
or a pod would run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.storage_emulator import StorageEmulator
from tests.tiers import starts

pytestmark = [pytest.mark.beam, pytest.mark.process, pytest.mark.server]

LIMIT = 400
TRAINING = {"method": "scdh", "bits": 16, "epochs": 3, "batch_size": 64}
TFHASH = [sys.executable, "-m", "tfhash.cli"]


def tfhash(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    done = subprocess.run([*TFHASH, *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"tfhash {' '.join(args)} exited with {done.returncode}:\n{done.stderr[-6000:]}"
    return done


def write_config(path, **settings) -> str:
    path.write_text(json.dumps({"name": "tiny-mnist", "map_threshold": 0.2, "training": TRAINING, **settings}))
    return str(path)


@pytest.fixture(scope="module")
@starts("process", "server")
def bucket(tmp_path_factory):
    """The emulated bucket, with the environment that points both clients at it set for every
    process the tests start (and this one); this machine's cache folder in the test's scratch."""
    emulator = StorageEmulator()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {**emulator.environment(), "TFHASH_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}.items():
            patch.setenv(key, value)
        try:
            yield emulator
        finally:
            emulator.stop()


@pytest.fixture(scope="module")
def exported(bucket, tmp_path_factory):
    """MNIST's standard split, 400 rows a split, exported by the same command to a local folder and
    to the bucket: ``(local folder, bucket URI)``."""
    local, remote = str(tmp_path_factory.mktemp("exported") / "mnist"), f"{bucket.root}/data/mnist"
    for target in (local, remote):
        tfhash("data", "export", "mnist", "--output", target, "--limit", str(LIMIT))
    return local, remote


@pytest.fixture(scope="module")
def local_run(exported, tmp_path_factory):
    """The reference: the pipeline on the local runner with local folders."""
    folder = tmp_path_factory.mktemp("local")
    config = write_config(folder / "config.json", data_dir=exported[0], run_dir=str(folder / "run"))
    tfhash("pipeline", "run", "--config", config)
    return json.loads((folder / "run" / "summary.json").read_text())


def index_files(index_dir: str) -> dict:
    """The sha256 of every file of an index, from its manifest (read where it lies)."""
    from tfhash.index import read_manifest

    return read_manifest(index_dir)["files"]


def query_records(data_dir: str, count: int = 32) -> list[bytes]:
    import tensorflow as tf

    files = tf.io.gfile.glob(f"{data_dir}/query/*")
    return [record.numpy() for record in tf.data.TFRecordDataset(sorted(files), compression_type="GZIP").take(count)]


def same_model(model_dir: str, reference_dir: str, records: list[bytes]) -> None:
    """Both SavedModels give the same continuous codes, to the bit, for ``records``. (Their
    fingerprints differ: the graph holds the paths of the Transform's assets where it ran.)"""
    import tensorflow as tf

    def codes(folder: str) -> np.ndarray:
        return tf.saved_model.load(folder).signatures["serving_default"](examples=tf.constant(records))["codes"].numpy()

    np.testing.assert_array_equal(codes(model_dir), codes(reference_dir))


def test_the_pipeline_runs_with_its_run_directory_in_a_bucket(bucket, exported, local_run, tmp_path):
    from tfhash import storage

    run_dir = f"{bucket.root}/runs/local-runner"
    config = write_config(tmp_path / "config.json", data_dir=exported[1], run_dir=run_dir)
    tfhash("pipeline", "run", "--config", config)
    summary = json.loads(storage.read_text(f"{run_dir}/summary.json"))
    assert summary["blessed"] is True and summary["metrics"] == local_run["metrics"]
    assert summary["model_dir"].startswith(f"{run_dir}/serving/tiny-mnist/") and summary["gallery"].startswith(f"{run_dir}/pipeline_root/")
    assert summary["indexes"]["BFlat"] == f"{run_dir}/indexes/tiny-mnist/{summary['model_version']}/BFlat"
    same_model(summary["model_dir"], local_run["model_dir"], query_records(exported[0]))
    assert index_files(summary["indexes"]["BFlat"]) == index_files(local_run["indexes"]["BFlat"])
    assert summary["example_query"]["answers"] == local_run["example_query"]["answers"]
    models_config = storage.read_text(f"{run_dir}/tf_serving/models.config")  # TF Serving reads the bucket itself
    assert f'base_path: "{run_dir}/serving/tiny-mnist"' in models_config
    assert sorted(os.listdir(tmp_path)) == ["config.json"]  # nothing of the run lands beside its config


def test_a_search_service_answers_from_the_model_and_index_in_the_bucket(bucket, exported, local_run):
    """The service reads the pushed model and its index from the bucket (the index through a local
    copy it maps) and answers as the local run's model and index do."""
    import tensorflow as tf
    from tfhash.serving.processes import start_command
    from tfhash.serving.search_client import SearchClient

    from tests.serving_fixtures import stop_cli
    from tfhash import storage
    from tfhash.index import load_embeddings, load_index, refined_search

    run_dir = f"{bucket.root}/runs/local-runner"
    queries = query_records(exported[0], 8)
    outputs = tf.saved_model.load(local_run["model_dir"]).signatures["serving_default"](examples=tf.constant(queries))
    local = local_run["indexes"]["BFlat"]
    expected = load_index(local).search(outputs["packed_codes"].numpy(), 10)
    refined = refined_search(load_index(local), load_embeddings(local), outputs["codes"].numpy(), 10)
    process, address = start_command(["serve", "search", "--model-base-dir", f"{run_dir}/serving/tiny-mnist", "--index-base-dir",
                                      f"{run_dir}/indexes/tiny-mnist", "--items", f"{exported[1]}/items.csv", "--port", "0"],
                                     "search service on ")  # fmt: skip
    try:
        with SearchClient(address) as client:
            answer = client.search(examples=queries, k=10, refine=False)  # Hamming order, the local index's
            second = client.search(examples=queries, k=10)  # the embeddings read through the same local copy
    finally:
        stop_cli(process)
    assert second.refined and not answer.refined
    np.testing.assert_array_equal(np.stack(second.ids), refined.ids)
    assert answer.exact and storage.isdir(f"{run_dir}/serving/tiny-mnist/{answer.model_version}")
    np.testing.assert_array_equal(np.stack(answer.ids), expected.ids)
    np.testing.assert_array_equal(np.stack(answer.distances), expected.distances)
    assert all(labels for row in answer.labels for labels in row)  # the items.csv in the bucket names each hit


def test_the_compiled_spec_runs_task_by_task_through_tfx_container_entrypoint(bucket, exported, local_run, tmp_path):
    """``tfhash pipeline compile`` writes the spec; each task's container command and arguments
    run as a pod runs them (tests/kubeflow_launcher.py), reading and writing the bucket; the pushed
    model, its evaluation and its index are the local runner's."""
    import yaml

    from tests.kubeflow_launcher import KubeflowRun
    from tfhash import storage

    run_dir = f"{bucket.root}/runs/kubeflow"
    config = write_config(tmp_path / "config.json", data_dir=exported[1], image="tfhash-pipeline:test")
    tfhash("pipeline", "compile", "--config", config, "--run-dir", run_dir, "--output", str(tmp_path / "pipeline.yaml"))
    spec = yaml.safe_load((tmp_path / "pipeline.yaml").read_text())
    (tmp_path / "pods").mkdir()
    # the image's python: this environment's (a pod's PATH finds the image's)
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}", "TF_CPP_MIN_LOG_LEVEL": "2"}
    outputs = KubeflowRun(spec, "run-1", str(tmp_path / "pods"), env).run()
    assert all(uri.startswith(f"{run_dir}/pipeline_root/tiny-mnist/run-1/") for uri in
               (artifact.uri for task in outputs.values() for artifact in task.values()))  # fmt: skip
    pushed = outputs["Pusher"]["pushed_model"].metadata
    assert pushed["pushed"] == 1 and pushed["pushed_destination"].startswith(f"{run_dir}/serving/tiny-mnist/")
    same_model(pushed["pushed_destination"], local_run["model_dir"], query_records(exported[0]))
    evaluation = storage.read_json(f"{outputs['RetrievalEvaluator']['evaluation'].uri}/metrics.json")
    assert evaluation["blessed"] and evaluation["metrics"] == local_run["metrics"]
    built = storage.read_json(f"{outputs['IndexBuilder']['index'].uri}/indexes.json")
    assert built["model_version"] == pushed["pushed_version"] and built["model_dir"] == pushed["pushed_destination"]
    assert index_files(built["indexes"]["BFlat"]) == index_files(local_run["indexes"]["BFlat"])
