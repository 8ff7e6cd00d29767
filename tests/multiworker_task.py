"""One worker of the two-worker training test (tests/test_multiworker.py): run as a process with
TF_CONFIG set. It trains one SCDH model with the Trainer's strategy (MultiWorkerMirroredStrategy
for a cluster of two workers), exports it where the Trainer would (the real directory on the
chief, a throw-away one elsewhere) and writes what it saw to ``<out>/worker-<index>.json``.

    python tests/multiworker_task.py <out dir> <serving dir>
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf
from tfhash.components.trainer import export_directory, is_chief, make_strategy, train

from tfhash.export import export_feature_model
from tfhash.models import build_scdh, mlp

ROWS, DIM, CLASSES, BITS, GLOBAL_BATCH, EPOCHS = 256, 16, 4, 16, 32, 2


def weights_digest(model) -> str:
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()


def main(out_dir: str, serving_dir: str) -> None:
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)  # the same data on every worker; the strategy shards it
    labels = rng.integers(0, CLASSES, ROWS)
    x = (rng.normal(size=(ROWS, DIM)) + 2.0 * np.eye(CLASSES, DIM)[labels]).astype("float32")
    y = np.eye(CLASSES, dtype="float32")[labels]
    strategy = make_strategy()
    with strategy.scope():
        model = build_scdh(mlp(DIM, (32,)), CLASSES, BITS)
        model.compile(optimizer=keras.optimizers.Adam(1e-2))
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    history = train(model, data, EPOCHS, callbacks=[])
    target = export_directory(serving_dir)
    export_feature_model(model, target, "x", [DIM], BITS)
    report = {"index": int(task["index"]), "chief": is_chief(),
              "multi_worker": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
              "replicas": int(strategy.num_replicas_in_sync), "weights": weights_digest(model),
              "loss": [float(v) for v in history.history["loss"]], "exported_to": target,
              "codes": model.encode(x[:8]).tolist()}  # fmt: skip
    with open(os.path.join(out_dir, f"worker-{task['index']}.json"), "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
