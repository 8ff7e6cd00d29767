"""Two-worker training, run for real: two processes on loopback with TF_CONFIG train one SCDH
model with MultiWorkerMirroredStrategy (the Trainer's make_strategy and train); the chief
exports, and both workers end with the same weights."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfhash.artifacts import BINARY_CODES, FEATURES_SIGNATURE

TASK = Path(__file__).resolve().parent / "multiworker_task.py"


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.process
def test_two_workers_train_one_model(tmp_path):
    workers = [f"localhost:{port}" for port in _free_ports(2)]
    serving = tmp_path / "serving"
    processes, logs = [], []
    for index in range(2):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}),
                   CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")  # fmt: skip
        log = open(tmp_path / f"worker-{index}.log", "w")  # noqa: SIM115 - closed below
        logs.append(log)
        processes.append(subprocess.Popen([sys.executable, str(TASK), str(tmp_path), str(serving)], env=env,
                                          stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
    try:
        codes = [p.wait(timeout=300) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
    assert codes == [0, 0], "\n".join((tmp_path / f"worker-{i}.log").read_text()[-3000:] for i in range(2))
    reports = [json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in range(2)]
    assert all(r["multi_worker"] and r["replicas"] == 2 for r in reports)
    assert [r["chief"] for r in reports] == [True, False]
    # one model: the same weights, the same training curve and the same codes on both workers
    assert reports[0]["weights"] == reports[1]["weights"]
    assert reports[0]["loss"] == reports[1]["loss"] and reports[0]["loss"][-1] < reports[0]["loss"][0]
    assert reports[0]["codes"] == reports[1]["codes"]
    # the chief exported to the serving directory, the other worker elsewhere; the export encodes as trained
    assert reports[0]["exported_to"] == str(serving) and reports[1]["exported_to"] != str(serving)
    loaded = tf.saved_model.load(str(serving))
    x = np.random.default_rng(0).normal(size=(3, 16)).astype("float32")
    assert loaded.signatures[FEATURES_SIGNATURE](x=tf.constant(x))[BINARY_CODES].shape == (3, 16)


def _trained(fit):
    import keras

    from tfhash.models import build_scdh, mlp

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 128)
    x = (rng.normal(size=(128, 16)) + 2.0 * np.eye(4, 16)[labels]).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, np.eye(4, dtype="float32")[labels])).batch(32)
    model = build_scdh(mlp(16, (32,)), 4, 16)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = fit(model, data)
    return [w.numpy() for w in model.weights], history.history


def test_fit_distributed_on_one_device_is_fit():
    """Without a cluster, fit_distributed trains exactly as Keras's fit: same weights, same logs."""
    from tfhash.distribute import fit_distributed

    weights, history = _trained(lambda model, data: fit_distributed(model, data, 3))
    expected_weights, expected_history = _trained(lambda model, data: model.fit(data, epochs=3, verbose=0))
    for got, want in zip(weights, expected_weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert history.keys() == expected_history.keys()
    np.testing.assert_allclose(history["loss"], expected_history["loss"], rtol=1e-5)


def test_fit_distributed_refuses_bad_arguments():
    import keras

    from tfhash.distribute import fit_distributed
    from tfhash.models import build_scdh, mlp

    model = build_scdh(mlp(16, (32,)), 4, 16)
    data = tf.data.Dataset.from_tensor_slices((np.zeros((4, 16), "float32"), np.eye(4, dtype="float32"))).batch(2)
    with pytest.raises(ValueError, match="needs a compiled model"):
        fit_distributed(model, data, 1)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    with pytest.raises(ValueError, match="epochs must be a positive int"):
        fit_distributed(model, data, 0)
