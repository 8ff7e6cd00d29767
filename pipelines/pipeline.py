"""The tfhash pipeline: ImportExampleGen -> RecordFilter (bad-record policy) -> StatisticsGen ->
SchemaGen -> Transform -> (Tuner, when the config has a ``tuner`` section) -> Trainer ->
RetrievalEvaluator (against the model serving now) -> Pusher -> IndexBuilder. The same definition
runs locally and on Kubeflow Pipelines (no node that only one orchestrator runs)."""

from __future__ import annotations

from tfhash.components.index_builder import IndexBuilder
from tfhash.components.record_filter import RecordFilter
from tfhash.components.retrieval_evaluator import RetrievalEvaluator
from tfhash.pipelines.config import PipelineConfig
from tfx import v1 as tfx
from tfx.proto import example_gen_pb2, transform_pb2

from tfhash.artifacts import SPLITS
from tfhash.registry import get_method

__all__ = ["EXAMPLE_GEN", "create_pipeline"]


#: The id of the pipeline's ExampleGen.
EXAMPLE_GEN = "ImportExampleGen"


def create_pipeline(config: PipelineConfig, metadata_connection=None) -> tfx.dsl.Pipeline:
    """Build the pipeline for ``config``. It reads no data: the components read the exported data's
    description (:func:`tfhash.artifacts.read_data_description`) from its folder when they run, so a
    pipeline compiled for a cluster holds the config's locations only."""
    where = config.layout
    data = where.data
    cross_modal = ",".join(config.modalities)  # "" for single-modality models
    example_gen = tfx.components.ImportExampleGen(
        input_base=data,
        input_config=example_gen_pb2.Input(
            splits=[example_gen_pb2.Input.Split(name=s, pattern=f"{s}/*") for s in SPLITS]
        ),
        payload_format=example_gen_pb2.FORMAT_PROTO,  # raw bytes: RecordFilter parses and checks them
    ).with_id(EXAMPLE_GEN)
    record_filter = RecordFilter(
        examples=example_gen.outputs["examples"],
        data_dir=data,
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
            "data_dir": data,
            "inputs": config.inputs,
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
            # only what the search reads, so that other training edits reuse the cached Tuner run: photos
            # search above the training section's network, cut and views (its trunk cache the Trainer's)
            custom_config={"training": config.to_dict()["training"] if config.training.backbone != "mlp" else
                           {"bits": config.training.bits, "seed": config.training.seed},
                           "tuner": config.to_dict()["tuner"], "inputs": config.inputs, "data_dir": data,
                           "data_root": config.data_root, "trunk_cache_dir": where.trunk_cache},  # fmt: skip
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
            "inputs": config.inputs,
            "data_dir": data,
            "data_root": config.data_root,
            "trunk_cache_dir": where.trunk_cache,
        },
    )
    evaluator = RetrievalEvaluator(
        examples=examples,
        model=trainer.outputs["model"],
        serving_base_dir=where.serving,  # the baseline: the model serving now (an ML Metadata resolver runs on Vertex AI only)
        data_dir=data,
        map_threshold=config.map_threshold,
        max_regression=config.max_regression,
        modalities=cross_modal,
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
        data_dir=data,
        kinds=",".join(config.index_kinds),
        embeddings=int(config.index_embeddings),
        modalities=cross_modal,
        milvus_uri=config.milvus,
        collection_prefix=config.name,
    )
    return tfx.dsl.Pipeline(
        pipeline_name=config.name,
        pipeline_root=where.pipeline_root,
        components=[example_gen, record_filter, statistics_gen, schema_gen, transform, *([tuner] if tuner else []), trainer,
                    evaluator, pusher, index_builder],  # fmt: skip
        enable_cache=True,
        metadata_connection_config=metadata_connection,
        beam_pipeline_args=list(config.beam_args),
    )
