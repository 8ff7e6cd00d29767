"""RetrievalEvaluator: encodes the query split in process and the database split as a Beam job of
code shards on the pipeline's runner (:mod:`tfhash.components.encoding`), computes the metrics
module's mAP@R, P@H<=2 and P@N over the shards one at a time (the numbers of the in-memory
evaluation), writes them (JSON + plots) as a ModelEvaluation, and blesses the model only when mAP
(cross-modal models: the mean of both directions) reaches ``map_threshold`` and is not below the
model serving now, the newest version the Pusher pushed (its mAP computed on the same data), by more
than ``max_regression``. The stock Pusher consumes the blessing."""



import apache_beam as beam
import numpy as np
import tensorflow as tf
from tfhash.components.encoding import (
    ShardJob,
    encode_split,
    run_shard_jobs,
    shards_dir,
    split_files,
)
from tfx.utils import path_utils
from tfx.v1.dsl.components import (
    BeamComponentParameter,
    InputArtifact,
    OutputArtifact,
    Parameter,
    component,
)
from tfx.v1.types import standard_artifacts

from tfhash import storage
from tfhash.artifacts import (
    EVALUATION_FILE,
    examples_signature,
    list_versions,
    model_version_dir,
    read_data_description,
)

__all__ = ["RetrievalEvaluator"]


def directions(modalities: list[str] | None) -> list[tuple[str, str]]:
    """The (query signature, database signature) pairs evaluated: one, or both ways for the two
    ``modalities`` of a cross-modal model."""
    if not modalities:
        return [(examples_signature(), examples_signature())]
    first, second = modalities
    return [(examples_signature(first), examples_signature(second)), (examples_signature(second), examples_signature(first))]


def retrieval_metrics(saved_model_dir: str, examples_uri: str, num_classes: int, query_split: str, database: dict,
                      top_r: int | None, modalities: list[str] | None = None) -> tuple[dict, object, tuple]:  # fmt: skip
    """Metrics summary of one model on one Examples artifact, the full report, and the encoded
    queries ``(packed codes, labels, ids)``. The queries are encoded here; the database is read from
    its code shards (``database``: database signature ->
    :class:`tfhash.components.code_shards.CodeShards`) one shard at a time.

    With two ``modalities`` (a cross-modal model) the queries of one modality search the database
    of the other, both ways: the summary holds each direction (``"image->text"``, ...) and their
    mean mAP under the usual keys, which the blessing uses; the report and the queries are the
    first direction's.
    """
    from tfhash.metrics import evaluate_retrieval_sharded

    def direction(query_signature: str, database_signature: str):
        # packed codes, labels and ids (the embeddings serve the second stage of a search, not these metrics)
        queries = encode_split(saved_model_dir, split_files(examples_uri, query_split), num_classes, signature=query_signature)[:3]
        shards = database[database_signature]
        report = evaluate_retrieval_sharded(queries[0], queries[1], shards.codes_and_labels, top_r=top_r, tie_aware=top_r is None,
                                            precision_at=[min(1000, len(shards))])  # fmt: skip
        return report.summary(radius=2), report, queries

    (forward, report, queries), *rest = [direction(*pair) for pair in directions(modalities)]
    if not rest:
        return forward, report, queries
    backward, _, _ = rest[0]
    first, second = modalities
    summary = {key: (value + backward[key]) / 2 if key.startswith("mAP") or key.startswith("P@") else value
               for key, value in forward.items()}  # fmt: skip
    summary.update({f"{first}->{second}": forward, f"{second}->{first}": backward})
    return summary, report, queries


def record_images(files: list[str], wanted: set[int]) -> dict:
    """``{id: uint8 pixels}`` of the records of ``files`` whose id is in ``wanted``: each record's
    first image-file feature (in feature-name order), decoded; records without one are left out
    (feature-vector data: the gallery shows labels only)."""
    import io

    from PIL import Image

    from tfhash.artifacts import ID
    from tfhash.data.export import image_type

    found = {}
    for path in files:
        for record in tf.data.TFRecordDataset(path, compression_type="GZIP"):
            example = tf.train.Example.FromString(record.numpy())
            features = example.features.feature
            item = int(features[ID].int64_list.value[0]) if features[ID].int64_list.value else None
            if item not in wanted or item in found:
                continue
            for name in sorted(features):
                values = features[name].bytes_list.value
                if values and image_type(values[0][:16]):
                    with Image.open(io.BytesIO(values[0])) as image:
                        found[item] = np.asarray(image.convert("L" if image.mode in ("L", "1", "I;16") else "RGB"))
                    break
    return found


def evaluation_gallery(output_dir: str, queries: tuple, examples_uri: str, query_split: str, database_split: str, shards,
                       curve: dict, class_names: list[str] | None, seed: int = 0) -> dict:  # fmt: skip
    """Write the gallery of an evaluation (:func:`tfhash.metrics.gallery.write_gallery`) beside it:
    queries chosen with ``seed`` among the encoded query split (``queries``: packed codes, labels
    and ids, as :func:`retrieval_metrics` returns them), each with its 10 nearest items of the
    database's code ``shards``, with their pictures when the records hold images."""
    from tfhash.metrics.gallery import gallery_queries, gallery_rows, nearest, write_gallery

    q_codes, q_labels, q_ids = queries
    chosen = gallery_queries(q_labels, seed=seed)
    ids, distances = nearest(q_codes[chosen], ((codes, shard_ids) for codes, _, shard_ids in shards), 10)
    wanted = set(ids.ravel().tolist())
    labels = {int(i): label for _, shard_labels, shard_ids in shards for i, label in zip(shard_ids, shard_labels, strict=True)
              if int(i) in wanted}  # fmt: skip
    pictures = record_images(split_files(examples_uri, query_split), set(q_ids[chosen].tolist()))
    pictures.update(record_images(split_files(examples_uri, database_split), wanted))
    rows = gallery_rows(q_ids[chosen], q_labels[chosen], ids, distances, labels.__getitem__,
                        pictures.get if pictures else None, class_names)  # fmt: skip
    return write_gallery(output_dir, rows, curve, f"Queries of the {query_split} split and their 10 nearest items", seed=seed)


def blessing_decision(candidate_map: float, baseline_map: float | None, threshold: float, max_regression: float) -> tuple[bool, str]:
    """Bless when mAP >= threshold and mAP >= baseline - max_regression (no baseline: threshold only)."""
    if candidate_map < threshold:
        return False, f"mAP {candidate_map:.4f} is below the threshold {threshold}"
    if baseline_map is not None and candidate_map < baseline_map - max_regression:
        return False, f"mAP {candidate_map:.4f} regresses more than {max_regression} from the serving model's {baseline_map:.4f}"
    return True, "blessed"


@component(use_beam=True)
def RetrievalEvaluator(
    examples: InputArtifact[standard_artifacts.Examples],
    model: InputArtifact[standard_artifacts.Model],
    evaluation: OutputArtifact[standard_artifacts.ModelEvaluation],
    blessing: OutputArtifact[standard_artifacts.ModelBlessing],
    data_dir: Parameter[str],
    serving_base_dir: Parameter[str] = "",
    map_threshold: Parameter[float] = 0.5,
    max_regression: Parameter[float] = 0.01,
    top_r: Parameter[int] = 0,
    query_split: Parameter[str] = "query",
    database_split: Parameter[str] = "database",
    modalities: Parameter[str] = "",
    gallery_seed: Parameter[int] = 0,
    beam_pipeline: BeamComponentParameter[beam.Pipeline] = None,
) -> None:
    """The TFX component (module docstring); ``data_dir``: the exported data, whose description
    (:func:`tfhash.artifacts.read_data_description`) gives the number of classes and their names;
    ``serving_base_dir``: the Pusher's destination, whose newest version (the model serving now:
    only blessed models are pushed) is the baseline (none there: the threshold alone decides)."""
    from tfhash.metrics.plots import plot_pr_curve

    description = read_data_description(data_dir)
    num_classes, class_names = int(description["num_classes"]), description.get("class_names") or None
    depth = top_r or None
    cross_modal = [m for m in modalities.split(",") if m] or None
    models = {"candidate": path_utils.serving_model_path(model.uri)}
    pushed = list_versions(serving_base_dir) if serving_base_dir else []
    if pushed:
        models["baseline"] = model_version_dir(serving_base_dir, pushed[-1])
    files = split_files(examples.uri, database_split)
    # the database side as one Beam job on the pipeline's runner; the candidate's codes stay in the
    # evaluation artifact for the IndexBuilder, the baseline's only while they are needed
    scratch = storage.join(evaluation.uri, "baseline-shards")
    jobs = {(name, signature): ShardJob(path, tuple(files), num_classes,
                                        shards_dir(evaluation.uri if name == "candidate" else scratch, path, files, num_classes, signature),
                                        signature)
            for name, path in models.items() for _, signature in directions(cross_modal)}  # fmt: skip

    def metrics(name: str):
        return retrieval_metrics(models[name], examples.uri, num_classes, query_split,
                                 {signature: found for (owner, signature), found in shards.items() if owner == name}, depth, cross_modal)  # fmt: skip

    try:
        shards = dict(zip(jobs, run_shard_jobs(beam_pipeline, list(jobs.values())), strict=True))
        summary, report, queries = metrics("candidate")
        baseline = metrics("baseline")[0] if "baseline" in models else None
        curve = {"precision": report.precision_by_radius.mean(axis=0), "recall": report.recall_by_radius.mean(axis=0)}
        gallery = evaluation_gallery(evaluation.uri, queries, examples.uri, query_split, database_split,
                                     shards[("candidate", directions(cross_modal)[0][1])], curve,
                                     class_names, gallery_seed)  # fmt: skip
    finally:
        storage.rmtree(scratch)
    label = "mAP@all" if depth is None else f"mAP@{depth}"
    blessed, reason = blessing_decision(summary[label], baseline[label] if baseline else None, map_threshold, max_regression)
    result = {"metrics": summary, "baseline": baseline, "blessed": blessed, "reason": reason, "model_uri": model.uri,
              "gallery": storage.basename(gallery["html"]), "gallery_seed": gallery_seed}  # fmt: skip
    storage.write_json(storage.join(evaluation.uri, EVALUATION_FILE), result)
    plot_pr_curve(curve, storage.join(evaluation.uri, "pr_curve.png"))
    storage.write_text(storage.join(blessing.uri, "BLESSED" if blessed else "NOT_BLESSED"), reason)
    blessing.set_int_custom_property("blessed", int(blessed))
    blessing.set_string_custom_property("current_model", model.uri)
    blessing.set_int_custom_property("current_model_id", model.id)
    if "baseline" in models:
        blessing.set_string_custom_property("baseline_model", models["baseline"])
