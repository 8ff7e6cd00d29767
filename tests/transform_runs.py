"""One tf.Transform analyse-and-transform on Beam's in-memory DirectRunner, for the tests of the
pipeline's Transform functions: rows in, transformed rows out (sorted by ``id``); and TFT's z-score
in NumPy, their reference."""

from __future__ import annotations

import json
import tempfile

import numpy as np


def analyze_and_transform(rows: list[dict], feature_spec: dict, preprocessing_fn) -> list[dict]:
    """``preprocessing_fn`` analysed over ``rows`` and applied to them; each output row's values as
    flat lists. ``preprocessing_fn`` must pass ``id`` through."""
    import apache_beam as beam
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam
    from apache_beam.options.pipeline_options import PipelineOptions

    def to_json(row):
        return json.dumps({k: np.asarray(v).reshape(-1).tolist() for k, v in row.items()})

    options = PipelineOptions(["--runner=DirectRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1"])
    with tempfile.TemporaryDirectory() as tmp:
        with beam.Pipeline(options=options) as pipeline, tft_beam.Context(temp_dir=tmp):
            raw = pipeline | beam.Create(rows)
            metadata = tft.DatasetMetadata.from_feature_spec(feature_spec)
            (transformed, _), _ = (raw, metadata) | tft_beam.AnalyzeAndTransformDataset(preprocessing_fn)
            _ = transformed | beam.Map(to_json) | beam.io.WriteToText(f"{tmp}/rows", shard_name_template="")
        with open(f"{tmp}/rows") as handle:
            out = [json.loads(line) for line in handle]
    return sorted(out, key=lambda r: r["id"][0])


def z_scores(x: np.ndarray, reference: np.ndarray, axis=None) -> np.ndarray:
    """``x`` z-scored with ``reference``'s mean and variance (over ``axis``; None: all values), as
    ``tft.scale_to_z_score`` does: ``x - mean`` where the variance is 0."""
    mean, variance = reference.mean(axis=axis), reference.var(axis=axis)
    return np.where(variance > 0, (x - mean) / np.sqrt(np.where(variance > 0, variance, 1.0)), x - mean)
