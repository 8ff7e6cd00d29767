"""Small real serving artifacts for the serving tests and benchmarks: a tfhash SCDH model over 8-d
feature vectors, exported with the pipeline's export code (both signatures, warmup records) under
a model base directory, its Hamming index under the IndexBuilder's layout, the library's own
answer to compare with, and the serving CLI started as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import numpy as np

DIM, BITS, CLASSES = 8, 16, 3
RAW_SPEC_NAME = "features"


def queued_behind(first, busy: threading.Event, release: threading.Event, queued, waiting) -> None:
    """Start ``first()`` on a thread and wait until it is ``busy``; start each of ``queued`` on a
    thread and wait until ``waiting()`` is true (they have queued behind it); then ``release`` it
    and wait for every thread."""
    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert busy.wait(10), "the first call never started"
    threads += [threading.Thread(target=call) for call in queued]
    for thread in threads[1:]:
        thread.start()
    deadline = time.monotonic() + 10
    while not waiting():
        assert time.monotonic() < deadline, "the calls did not queue up"
        time.sleep(0.01)
    release.set()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()


def vector_example(values, label: int | None = None, item_id: int = 0) -> bytes:
    import tensorflow as tf

    feature = {"features": tf.train.Feature(float_list=tf.train.FloatList(value=list(map(float, values)))),
               "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[item_id]))}  # fmt: skip
    if label is not None:
        feature["labels"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def database(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Clustered 8-d vectors and their int64 ids (shuffled, not in label order)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 3, size=(CLASSES, DIM))
    labels = rng.integers(0, CLASSES, size=n)
    return (centres[labels] + rng.normal(0, 1, size=(n, DIM))).astype(np.float32), np.arange(1000, 1000 + n, dtype=np.int64)


def export_version(base_dir: str, version: int, seed: int) -> str:
    """Export an (untrained, seeded) SCDH model as ``<base_dir>/<version>``; different seeds give
    different codes."""
    import keras

    from tfhash.export import export_feature_model
    from tfhash.models import build_scdh, mlp

    keras.utils.set_random_seed(seed)
    model = build_scdh(mlp(DIM, (16,)), CLASSES, BITS)
    model(np.zeros((1, DIM), np.float32))
    path = os.path.join(base_dir, str(version))
    export_feature_model(model, path, RAW_SPEC_NAME, [DIM], BITS, [vector_example(np.zeros(DIM))], model_name="vectors")
    return path


def build_index(model_dir: str, index_base_dir: str, version: int, vectors, ids, kind: str = "BFlat", embeddings: bool = False,
                **params) -> str:  # fmt: skip
    """Encode ``vectors`` with the SavedModel and save the index as the IndexBuilder does, with the
    items' embeddings when asked (``params``: the index type's keywords, e.g. a Milvus index's
    ``uri`` and ``collection``)."""
    import tensorflow as tf

    from tfhash.artifacts import signature_fingerprint
    from tfhash.index import Embeddings, index_factory

    outputs = tf.saved_model.load(model_dir).signatures["encode_features"](features=tf.constant(vectors))
    index = index_factory(BITS, kind, **params)
    try:
        index.add(outputs["packed_codes"].numpy(), ids)
        path = os.path.join(index_base_dir, str(version), kind)
        stored = Embeddings.of(outputs["codes"].numpy(), ids) if embeddings else None
        index.save(path, model_version=str(version), signature_fingerprint=signature_fingerprint(model_dir), embeddings=stored)
    finally:
        index.close()
    return path


def push_version(base_dir: str, index_base_dir: str, version: int, seed: int, vectors, ids, kind: str = "BFlat", **params):
    """What the pipeline's Pusher + IndexBuilder leave behind for one version."""
    model_dir = export_version(base_dir, version, seed)
    return model_dir, build_index(model_dir, index_base_dir, version, vectors, ids, kind, **params)


def reference(model_dir: str, index_dir: str, vectors: np.ndarray, k: int):
    """The library's own answer: encode with the SavedModel, search the loaded index."""
    import tensorflow as tf

    from tfhash.index import load_index

    packed = tf.saved_model.load(model_dir).signatures["encode_features"](features=tf.constant(vectors))["packed_codes"]
    return packed.numpy(), load_index(index_dir).search(packed.numpy(), k)


def graph_mode_outputs(model_dir: str, signature: str, inputs: dict, output: str = "packed_codes") -> np.ndarray:
    """Run a signature through the graph-mode SavedModel loader (the restore op and a session), the
    way ``tensorflow_model_server`` and ``saved_model_cli`` load a model."""
    import tensorflow as tf

    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.load(session, ["serve"], model_dir)
        signature_def = meta_graph.signature_def[signature]
        feeds = {signature_def.inputs[name].name: value for name, value in inputs.items()}
        return session.run(signature_def.outputs[output].name, feeds)


def stop_cli(process, limit: float = 60.0) -> None:
    """SIGTERM a :func:`~tfhash.serving.processes.start_command` process and wait for exit code 0 and the end of its log; any
    other code, or a process still running ``limit`` seconds later (then killed), fails the test
    with the end of its log."""
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(limit)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        code = f"still running {limit:g} s after SIGTERM"
    process.drain.join(10)  # its stderr is read to the end
    if code != 0:
        raise AssertionError(f"tfhash stopped with {code}; its log ends:\n{''.join(process.log)}")


def cli_rest_port(process) -> int | None:
    """The REST port on the ready line of a :func:`start_command` search service (None without REST)."""
    line = process.ready_line
    if "REST on " not in line:
        return None
    return int(line.split("REST on ", 1)[1].split()[0].rstrip(",;").rsplit(":", 1)[1])


def wait_for(condition, seconds: float = 60.0) -> bool:
    """Whether ``condition()`` became true within ``seconds`` (looked at every 0.05 s)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
