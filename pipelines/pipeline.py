"""The tfhash pipeline: ImportExampleGen -> RecordFilter (bad-record policy) -> StatisticsGen ->
SchemaGen -> Transform -> (Tuner, when the config has a ``tuner`` section) -> Trainer -> RetrievalEvaluator (against the latest blessed model) -> Pusher
-> IndexBuilder."""

from __future__ import annotations

import json

from tfhash.components.index_builder import IndexBuilder
from tfhash.components.record_filter import RecordFilter
from tfhash.components.retrieval_evaluator import RetrievalEvaluator
from tfhash.pipelines.config import PipelineConfig
from tfx import v1 as tfx
from tfx.proto import example_gen_pb2, transform_pb2

from tfhash.artifacts import SPLITS
from tfhash.registry import get_method


def model_inputs(metadata: dict, names: list[str]) -> dict[str, list[int]]:
    """``{modality: shape}`` of the model inputs, checked against the exported data."""
    missing = [name for name in names if name not in metadata["modalities"]]
    if missing:
        raise ValueError(f"the exported data has no modality {missing}; it has {sorted(metadata['modalities'])}")
    return {name: list(metadata["modalities"][name]["shape"]) for name in names}


def create_pipeline(config: PipelineConfig, metadata: dict, metadata_connection=None, pipeline_root: str | None = None,
                    data_dir: str | None = None) -> tfx.dsl.Pipeline:  # fmt: skip
    """Build the pipeline for ``config`` over data exported with ``metadata`` (see
    :func:`tfhash.data.export.export_tfrecords`)."""
    where = config.layout
    inputs = model_inputs(metadata, config.inputs)
    cross_modal = ",".join(config.modalities)  # "" for single-modality models
    num_classes = int(metadata["num_classes"])
    example_gen = tfx.components.ImportExampleGen(
        input_base=data_dir or where.data,
        input_config=example_gen_pb2.Input(
            splits=[example_gen_pb2.Input.Split(name=s, pattern=f"{s}/*") for s in SPLITS]
        ),
        payload_format=example_gen_pb2.FORMAT_PROTO,  # raw bytes: RecordFilter parses and checks them
    )
    record_filter = RecordFilter(
        examples=example_gen.outputs["examples"],
        num_classes=num_classes,
        modalities=json.dumps(metadata["modalities"]),
        policy=config.bad_records,
    )
    examples = record_filter.outputs["filtered_examples"]
    statistics_gen = tfx.components.StatisticsGen(examples=examples)
    schema_gen = tfx.components.SchemaGen(statistics=statistics_gen.outputs["statistics"], infer_feature_shape=True)
    transform = tfx.components.Transform(
        examples=examples,
        schema=schema_gen.outputs["schema"],
        preprocessing_fn="tfhash.components.preprocessing.preprocessing_fn",
        splits_config=transform_pb2.SplitsConfig(analyze=["train"], transform=list(SPLITS)),
        custom_config={
            "num_classes": num_classes,
            "modalities": {name: metadata["modalities"][name] for name in inputs},
            "jcch_anchors": config.jcch_anchors,
            "input_maps": config.input_maps(),
            "seed": config.training.seed,
            # a tuned method may need them whatever the section names
            "tag_statistics": get_method(config.training.method).needs_tag_statistics or config.tuner is not None,
        },
    )
    tuner = None
    if config.tuner is not None:
        tuner = tfx.components.Tuner(
            tuner_fn="tfhash.components.tuner.tuner_fn",
            examples=transform.outputs["transformed_examples"],
            transform_graph=transform.outputs["transform_graph"],
            schema=schema_gen.outputs["schema"],
            # the validation split is carved from the training rows: the queries are never read
            train_args=tfx.proto.TrainArgs(splits=["train"]),
            eval_args=tfx.proto.EvalArgs(splits=["train"]),
            # only what the search reads, so that other training edits reuse the cached Tuner run
            custom_config={"training": {"bits": config.training.bits, "seed": config.training.seed},
                           "tuner": config.to_dict()["tuner"], "inputs": inputs, "num_classes": num_classes},  # fmt: skip
        )
    trainer = tfx.components.Trainer(
        run_fn="tfhash.components.trainer.run_fn",
        hyperparameters=None if tuner is None else tuner.outputs["best_hyperparameters"],
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema_gen.outputs["schema"],
        train_args=tfx.proto.TrainArgs(splits=["train"]),
        eval_args=tfx.proto.EvalArgs(splits=["query"]),
        custom_config={
            "training": config.to_dict()["training"],
            "inputs": inputs,
            "num_classes": num_classes,
            "raw_examples_dir": data_dir or where.data,
            "data_root": config.data_root,
            "modalities": metadata["modalities"],
            "trunk_cache_dir": where.trunk_cache,
        },
    )
    baseline = tfx.dsl.Resolver(
        strategy_class=tfx.dsl.experimental.LatestBlessedModelStrategy,
        model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
        model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
    ).with_id("latest_blessed_model_resolver")
    evaluator = RetrievalEvaluator(
        examples=examples,
        model=trainer.outputs["model"],
        baseline_model=baseline.outputs["model"],
        num_classes=num_classes,
        map_threshold=config.map_threshold,
        max_regression=config.max_regression,
        modalities=cross_modal,
        class_names=json.dumps(list(metadata.get("class_names") or [])),
    )
    pusher = tfx.components.Pusher(
        model=trainer.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=where.serving)
        ),
    )
    index_builder = IndexBuilder(
        examples=examples,
        pushed_model=pusher.outputs["pushed_model"],
        evaluation=evaluator.outputs["evaluation"],
        index_base_dir=where.indexes,
        num_classes=num_classes,
        kinds=",".join(config.index_kinds),
        modalities=cross_modal,
        milvus_uri=config.milvus,
        collection_prefix=config.name,
    )
    return tfx.dsl.Pipeline(
        pipeline_name=config.name,
        pipeline_root=pipeline_root or where.pipeline_root,
        components=[example_gen, record_filter, statistics_gen, schema_gen, transform, *([tuner] if tuner else []), trainer, baseline,
                    evaluator, pusher, index_builder],  # fmt: skip
        enable_cache=True,
        metadata_connection_config=metadata_connection,
        beam_pipeline_args=list(config.beam_args),
    )
