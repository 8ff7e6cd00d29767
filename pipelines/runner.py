"""Run the pipeline locally (LocalDagRunner, SQLite ML Metadata in the run directory) or compile
it for Kubeflow Pipelines (KubeflowV2DagRunner), and summarise a local run."""

from __future__ import annotations

import glob
import json
import os
import time

import numpy as np
from tfhash.pipelines.config import PipelineConfig
from tfhash.pipelines.pipeline import create_pipeline, paths


def export_data(config: PipelineConfig, log=print) -> dict:
    """Write the dataset's split as TFRecords once per run directory (reused when present); with
    ``data_dir`` set, use the TFRecords exported there."""
    from tfhash.data import load_dataset
    from tfhash.data.export import export_tfrecords

    target = paths(config)["data"]
    meta_path = os.path.join(target, "metadata.json")
    if os.path.isfile(meta_path):
        return json.loads(open(meta_path).read())
    if config.data_dir:
        raise ValueError(f"data_dir {config.data_dir} has no metadata.json: write it with `tfhash data export` "
                         "or `tfhash data export-user`")  # fmt: skip
    log(f"exporting {config.dataset} (split seed {config.split_seed}) to {target}")
    return export_tfrecords(load_dataset(config.dataset, config.data_root, config.split_seed), target, limit=config.limit)


def run_local(config: PipelineConfig, log=print) -> dict:
    """Export the data if needed, run the pipeline with LocalDagRunner, write the TF Serving
    artifacts for the pushed model (:mod:`tfhash.serving.deployment`), write and return the summary."""
    from tfx import v1 as tfx

    start = time.perf_counter()
    metadata = export_data(config, log)
    where = paths(config)
    connection = tfx.orchestration.metadata.sqlite_metadata_connection_config(where["metadata"])
    log(f"running pipeline {config.name!r} (pipeline root {where['pipeline_root']})")
    tfx.orchestration.LocalDagRunner().run(create_pipeline(config, metadata, connection))
    summary = summarise(config)
    if summary.get("model_version"):
        from tfhash.serving.deployment import write_deployment

        summary["tf_serving_config"] = os.path.join(config.run_dir, "tf_serving")
        write_deployment(where["serving"], config.name, summary["tf_serving_config"], index_base_dir=where["indexes"])
    summary["wall_seconds"] = round(time.perf_counter() - start, 1)
    with open(os.path.join(config.run_dir, "summary.json"), "w") as handle:
        json.dump(summary, handle, indent=2)
    return summary


def _newest(pattern: str) -> str | None:
    found = glob.glob(pattern)
    return max(found, key=os.path.getmtime) if found else None


def summarise(config: PipelineConfig) -> dict:
    """Model version, metrics, index path and an example query of the latest run."""
    where = paths(config)
    evaluation = _newest(os.path.join(where["pipeline_root"], "RetrievalEvaluator", "evaluation", "*", "metrics.json"))
    result = json.loads(open(evaluation).read()) if evaluation else {}
    records = _newest(os.path.join(where["pipeline_root"], "RecordFilter", "report", "*", "report.json"))
    built = _newest(os.path.join(where["pipeline_root"], "IndexBuilder", "index", "*", "indexes.json"))
    indexes = json.loads(open(built).read()) if built else {}
    summary = {
        "pipeline": config.name,
        "metrics": result.get("metrics"),
        "blessed": result.get("blessed"),
        "blessing_reason": result.get("reason"),
        "model_version": indexes.get("model_version"),
        "model_dir": indexes.get("model_dir"),
        "indexes": indexes.get("indexes"),
        "bad_records": json.loads(open(records).read()) if records else None,
    }
    if indexes.get("indexes"):
        summary["example_query"] = example_query(config, indexes)
    return summary


def example_query(config: PipelineConfig, indexes: dict) -> dict:
    """Encode the first query example with the pushed model and search the first index."""
    import tensorflow as tf

    from tfhash.index import load_index

    query_files = sorted(glob.glob(os.path.join(paths(config)["data"], "query", "*")))
    first = next(iter(tf.data.TFRecordDataset(query_files, compression_type="GZIP").take(1)))
    serve = tf.saved_model.load(indexes["model_dir"]).signatures["serving_default"]
    code = serve(examples=tf.reshape(first, [1]))["packed_codes"].numpy()
    kind, path = next(iter(indexes["indexes"].items()))
    index = load_index(path, expected_model_version=indexes["model_version"])
    result = index.search(code, 5)
    parsed = tf.io.parse_single_example(first, {"labels": tf.io.VarLenFeature(tf.int64), "id": tf.io.FixedLenFeature([1], tf.int64)})
    return {
        "query_id": int(parsed["id"].numpy()[0]),
        "query_labels": tf.sparse.to_dense(parsed["labels"]).numpy().tolist(),
        "index": kind,
        "nearest_ids": result.ids[0].tolist(),
        "distances": np.asarray(result.distances[0]).tolist(),
    }


def compile_kubeflow(config: PipelineConfig, output: str, metadata: dict | None = None) -> str:
    """Compile the pipeline to a Kubeflow Pipelines v2 JSON naming ``config.image``. The data
    location and the run directory must then be reachable from the cluster (e.g. gs:// paths)."""
    from tfx import v1 as tfx

    metadata = metadata or export_data(config)
    runner = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(default_image=config.image),
        output_filename=output,
    )
    runner.run(create_pipeline(config, metadata))
    return output
