"""Run the pipeline locally (LocalDagRunner, SQLite ML Metadata in the run directory) or compile
it for Kubeflow Pipelines (KubeflowV2DagRunner), and summarise a local run from what ML Metadata
recorded of it."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import time
import uuid
from collections.abc import Callable, Iterator

import numpy as np
from tfhash.pipelines.config import PipelineConfig
from tfhash.pipelines.pipeline import EXAMPLE_GEN, create_pipeline

from tfhash import storage
from tfhash.artifacts import (
    DATA_DESCRIPTION_FILE,
    EVALUATION_FILE,
    EXAMPLES_INPUT,
    EXAMPLES_SIGNATURE,
    ID,
    INDEXES_FILE,
    ITEMS_FILE,
    LABELS,
    PACKED_CODES,
    RECORDS_REPORT_FILE,
    TRAINING_FILE,
    TUNER_CHOICE_FILE,
    TUNER_RESULTS_FILE,
    Item,
    RunLayout,
    label_spec,
    model_inputs,
    read_data_description,
    read_items,
)

__all__ = ["RunDirectoryInUse", "run_lock", "export_data", "run_local", "run_outputs", "summarise", "example_query",
           "compile_kubeflow"]  # fmt: skip


class RunDirectoryInUse(ValueError):
    """Another ``tfhash pipeline run`` on this machine holds the run directory."""


@contextlib.contextmanager
def run_lock(layout: RunLayout) -> Iterator[None]:
    """Hold ``layout``'s run directory for one run at a time on this machine: an exclusive lock on
    the file beside its ML Metadata (``metadata.sqlite.lock``, local for a remote run directory too).
    The operating system releases it when the process ends, however it ends, so a killed run leaves
    no stale lock. Two machines sharing one remote run directory are not kept apart by it.

    Raises:
        RunDirectoryInUse: the lock is held; the message names the holder (its pid and start time).
    """
    path = layout.metadata + ".lock"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process that has not yet said which"
            raise RunDirectoryInUse(f"{layout.run_dir} is in use by another `tfhash pipeline run` ({holder}); wait for it to end, "
                                    "or give this run another run_dir") from None  # fmt: skip
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


def export_data(config: PipelineConfig, log=print) -> dict:
    """Write the dataset's split as TFRecords once per run directory (reused when present: its
    description, :func:`tfhash.artifacts.read_data_description`, is written last); with ``data_dir``
    set, use the TFRecords exported there. Returns the data's description."""
    from tfhash.data import load_dataset
    from tfhash.data.export import export_tfrecords

    target = config.layout.data
    if config.data_dir or storage.isfile(storage.join(target, DATA_DESCRIPTION_FILE)):
        return read_data_description(target)
    log(f"exporting {config.dataset} (split seed {config.split_seed}) to {target}")
    return export_tfrecords(load_dataset(config.dataset, config.data_root, config.split_seed), target, limit=config.limit)


def run_local(config: PipelineConfig, log=print, after_push: Callable[[RunLayout], dict] | None = None) -> dict:
    """Export the data if needed, run the pipeline with LocalDagRunner, write and return the
    summary. When the run pushed a model version, ``after_push(layout)`` (e.g. the command line's
    TF Serving config writer) runs and its entries join the summary. The run holds its run
    directory (:func:`run_lock`): a second run started on it meanwhile is refused.

    Raises:
        RunDirectoryInUse: another run on this machine holds the run directory.
    """
    start = time.perf_counter()
    if config.uses_milvus:  # an unreachable Milvus (or a Lite file another process holds) fails now, not after training
        from tfhash.index.milvus import check_reachable

        check_reachable(config.milvus)
    with run_lock(config.layout):  # two runs on one run directory would interleave their metadata and versions
        return _run_local(config, log, after_push, start)


def _run_local(config: PipelineConfig, log, after_push, start: float) -> dict:
    from tfx import v1 as tfx

    model_inputs(export_data(config, log), config.inputs)  # the inputs are in the data, or fail now
    where = config.layout
    connection = tfx.orchestration.metadata.sqlite_metadata_connection_config(where.metadata)
    log(f"running pipeline {config.name!r} (pipeline root {where.pipeline_root})")
    run_id = new_run_id()
    local_runner(run_id).run(create_pipeline(config, connection))
    summary = summarise(config, run_id)
    if summary.get("model_version") and after_push is not None:
        summary.update(after_push(where))
    summary["wall_seconds"] = round(time.perf_counter() - start, 1)
    storage.write_json(where.summary, summary)
    return summary


def new_run_id() -> str:
    """A pipeline run id: the start time, as LocalDagRunner's own ids, and a random suffix that
    keeps two runs started in the same microsecond apart."""
    return f"{datetime.datetime.now().isoformat()}-{uuid.uuid4().hex[:8]}"


def local_runner(run_id: str):
    """A LocalDagRunner that runs the pipeline under ``run_id``. LocalDagRunner names each run by
    the time it starts and does not return the name; ML Metadata records it as the name of the
    run's ``pipeline_run`` context, which is how :func:`summarise` finds the run's executions."""
    from tfx import v1 as tfx
    from tfx.dsl.compiler import constants
    from tfx.orchestration.portable import runtime_parameter_utils

    class NamedRunLocalDagRunner(tfx.orchestration.LocalDagRunner):
        def run_with_ir(self, pipeline, run_options=None, **kwargs):
            # Bound here, LocalDagRunner's own substitution of the run id finds nothing left to set.
            runtime_parameter_utils.substitute_runtime_parameter(pipeline, {constants.PIPELINE_RUN_ID_PARAMETER_NAME: run_id})
            return super().run_with_ir(pipeline, run_options, **kwargs)

    return NamedRunLocalDagRunner()


def _metadata_store(path: str):
    """The run's ML Metadata store (SQLite), opened read-only; None when there is none."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    if not os.path.isfile(path):
        return None
    connection = metadata_store_pb2.ConnectionConfig()
    connection.sqlite.filename_uri = path
    connection.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(connection)


def run_outputs(config: PipelineConfig, run_id: str | None = None) -> dict:
    """``{(component id, output key): artifact}`` (ML Metadata ``Artifact`` protos) of one run of the
    pipeline: run ``run_id``, or its most recent run in the run directory's ML Metadata store.

    The run's executions are those in both the pipeline's context and the run's ``pipeline_run``
    context that completed or were served from the cache; their outputs are the artifacts linked by
    OUTPUT events, which for a cached execution are the artifacts of the earlier execution it reused.
    Empty when the store, the pipeline or the run is unknown."""
    from ml_metadata.proto import metadata_store_pb2
    from tfx.dsl.compiler import constants

    store = _metadata_store(config.layout.metadata)
    pipeline = None if store is None else store.get_context_by_type_and_name(constants.PIPELINE_CONTEXT_TYPE_NAME, config.name)
    if pipeline is None:
        return {}
    in_pipeline = {execution.id for execution in store.get_executions_by_context(pipeline.id)}
    runs = {run.id: run for run in store.get_contexts_by_type(constants.PIPELINE_RUN_CONTEXT_TYPE_NAME)
            if run_id is None or run.name == run_id}  # fmt: skip
    done = (metadata_store_pb2.Execution.COMPLETE, metadata_store_pb2.Execution.CACHED)
    executions_by_run = {key: [e for e in store.get_executions_by_context(key) if e.id in in_pipeline and e.last_known_state in done]
                         for key in runs}  # fmt: skip
    candidates = [key for key, executions in executions_by_run.items() if executions]
    if not candidates:
        return {}
    executions = executions_by_run[max(candidates, key=lambda key: (runs[key].create_time_since_epoch, key))]
    node_prefix = f"{config.name}."
    node_of = {}
    for execution in executions:
        for context in store.get_contexts_by_execution(execution.id):
            if context.type == constants.NODE_CONTEXT_TYPE_NAME and context.name.startswith(node_prefix):
                node_of[execution.id] = context.name[len(node_prefix):]
    events = [event for event in store.get_events_by_execution_ids(list(node_of))
              if event.type == metadata_store_pb2.Event.OUTPUT and event.path.steps]  # fmt: skip
    artifacts = {artifact.id: artifact for artifact in store.get_artifacts_by_id([event.artifact_id for event in events])}
    return {(node_of[event.execution_id], event.path.steps[0].key): artifacts[event.artifact_id]
            for event in sorted(events, key=lambda event: event.artifact_id) if event.artifact_id in artifacts}  # fmt: skip


def _artifact_json(artifact, name: str):
    """The JSON file ``name`` that a component wrote into its output ``artifact``; None without one."""
    path = storage.join(artifact.uri, name) if artifact is not None else None
    if path is None or not storage.isfile(path):
        return None
    return storage.read_json(path)


def _custom_property(artifact, name: str):
    """A custom property of an ML Metadata artifact; None when it is not set."""
    value = artifact.custom_properties.get(name) if artifact is not None else None
    return getattr(value, value.WhichOneof("value")) if value is not None and value.WhichOneof("value") else None


def summarise(config: PipelineConfig, run_id: str | None = None) -> dict:
    """Model version, metrics, index path and an example query of pipeline run ``run_id`` (None:
    the pipeline's most recent run), read from the outputs that ML Metadata recorded for that run's
    executions (:func:`run_outputs`): the RecordFilter's report, the RetrievalEvaluator's
    evaluation (its metrics and gallery), the Pusher's pushed model (version and folder, when it pushed), the
    IndexBuilder's indexes and, with a ``tuner``, the Tuner's chosen settings and completed trials."""
    outputs = run_outputs(config, run_id)
    evaluation = outputs.get(("RetrievalEvaluator", "evaluation"))
    result = _artifact_json(evaluation, EVALUATION_FILE) or {}
    pushed = outputs.get(("Pusher", "pushed_model"))
    indexes = {"model_version": None, "model_dir": None, "indexes": None}
    if _custom_property(pushed, "pushed"):
        indexes.update(model_version=_custom_property(pushed, "pushed_version"),
                       model_dir=_custom_property(pushed, "pushed_destination"))  # fmt: skip
        built = _artifact_json(outputs.get(("IndexBuilder", "index")), INDEXES_FILE) or {}
        indexes["indexes"] = built.get("indexes")
    summary = {
        "pipeline": config.name,
        "metrics": result.get("metrics"),
        "blessed": result.get("blessed"),
        "blessing_reason": result.get("reason"),
        "gallery": storage.join(evaluation.uri, result["gallery"]) if result.get("gallery") else None,
        **indexes,
        "bad_records": _artifact_json(outputs.get(("RecordFilter", "report")), RECORDS_REPORT_FILE),
    }
    summary["training"] = _artifact_json(outputs.get(("Trainer", "model_run")), TRAINING_FILE)
    chosen = _artifact_json(outputs.get(("Tuner", "best_hyperparameters")), TUNER_CHOICE_FILE)
    if chosen is not None:
        values = chosen.get("values", {})
        summary["tuning"] = {"chosen": {k: v for k, v in values.items() if not k.startswith("tuner/")},
                             "trials": _artifact_json(outputs.get(("Tuner", "tuner_results")), TUNER_RESULTS_FILE)}  # fmt: skip
    if indexes.get("indexes"):
        summary["example_query"] = example_query(config, indexes)
    return summary


def example_query(config: PipelineConfig, indexes: dict) -> dict:
    """Encode the first query example with the pushed model and search every index built for it:
    the 5 nearest ids and distances from each, and whether all indexes agree on the distances;
    with the data's ``items.csv``, the query's and each neighbour's file and class names too."""
    import tensorflow as tf

    from tfhash.index import load_index

    query_files = storage.glob(storage.join(config.layout.data, "query", "*"))
    first = next(iter(tf.data.TFRecordDataset(query_files, compression_type="GZIP").take(1)))
    serve = tf.saved_model.load(indexes["model_dir"]).signatures[EXAMPLES_SIGNATURE]
    code = serve(**{EXAMPLES_INPUT: tf.reshape(first, [1])})[PACKED_CODES].numpy()
    answers = {}
    for kind, path in indexes["indexes"].items():
        index = load_index(path, expected_model_version=indexes["model_version"])
        try:
            result = index.search(code, 5)
        finally:
            index.close()
        answers[kind] = {"nearest_ids": result.ids[0].tolist(), "distances": np.asarray(result.distances[0]).tolist()}
    parsed = tf.io.parse_single_example(first, label_spec())
    example = {
        "query_id": int(parsed[ID].numpy()[0]),
        "query_labels": tf.sparse.to_dense(parsed[LABELS]).numpy().tolist(),
        "answers": answers,
        "same_distances": len({tuple(answer["distances"]) for answer in answers.values()}) == 1,
    }
    items_file = storage.join(config.layout.data, ITEMS_FILE)
    if storage.isfile(items_file):
        items = read_items(items_file)

        def named(item_id: int) -> dict:
            item = items.get(item_id, Item("", ()))
            return {"id": item_id, "path": item.path, "labels": list(item.labels)}

        example["query_item"] = named(example["query_id"])
        for answer in answers.values():
            answer["nearest_items"] = [named(i) for i in answer["nearest_ids"]]
    return example


def compile_kubeflow(config: PipelineConfig, output: str) -> str:
    """Compile the pipeline for Kubeflow Pipelines v2 (its tasks run ``config.image``) and write it
    to ``output`` (a file or a URI), and nothing else: no data is read or exported (the components
    read the data's description when they run). Its locations are the config's as they are, so they
    must be reachable from the cluster's pods (:meth:`PipelineConfig.load` with ``for_cluster``).

    ``output`` ending in ``.yaml`` / ``.yml``: the PipelineSpec, which ``kfp.Client`` submits to
    Kubeflow Pipelines; otherwise the PipelineJob JSON that Vertex AI Pipelines runs. Both use the
    pipeline spec schema 2.1 (the Kubeflow Pipelines backend reads no other), name the run
    directory's ``pipeline_root`` as the default pipeline root, and run ImportExampleGen uncached:
    Kubeflow Pipelines does not run TFX's driver that fingerprints the input files, so a cached
    ExampleGen would keep reading data exported again to the same place."""
    import yaml
    from tfx import v1 as tfx

    runner = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(default_image=config.image, use_pipeline_spec_2_1=True))
    job = runner.run(create_pipeline(config), write_out=False)
    spec = job["pipelineSpec"]
    spec["defaultPipelineRoot"] = config.layout.pipeline_root
    spec["root"]["dag"]["tasks"][EXAMPLE_GEN]["cachingOptions"] = {"enableCache": False}
    if output.endswith((".yaml", ".yml")):
        storage.write_text(output, yaml.safe_dump(spec, sort_keys=True))
    else:
        storage.write_json(output, job)
    return output
