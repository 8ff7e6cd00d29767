"""IndexBuilder: the pipeline component that builds tfhash indexes for exactly the pushed SavedModel version.

The database split is encoded with that version as code shards (a Beam job on the pipeline's runner),
and the indexes are filled from the shards and saved locked to that version.
"""


import logging

import apache_beam as beam
from tfhash.components.encoding import ShardJob, run_shard_jobs, shards_dir, split_files
from tfx.v1.dsl.components import (
    BeamComponentParameter,
    InputArtifact,
    OutputArtifact,
    Parameter,
    component,
)
from tfx.v1.types import standard_artifacts

from tfhash import storage
from tfhash.artifact_types import BuiltIndexes
from tfhash.artifacts import (
    INDEXES_FILE,
    examples_signature,
    index_dir,
    index_name,
    read_data_description,
    signature_fingerprint,
)

__all__ = ["fill_index", "IndexBuilder"]


logger = logging.getLogger(__name__)


def fill_index(index, shards) -> None:
    """Fill ``index`` with the codes and ids of ``shards`` (a
    :class:`tfhash.components.code_shards.CodeShards`), in record order. An index held in this
    process (BFlat, BMIH, the FAISS binary types, ScaNN) takes every code in one add
    (:meth:`~tfhash.index.base.HashIndex.add_batches`), gathered shard by shard into one array (so
    an IVF quantizer trains on all codes, as it would from arrays, and BMIH builds one segment on
    that array, not a copy; ScaNN then builds its float rows from them: the exception to memory of
    packed codes only); an index held elsewhere (Milvus) takes one shard at a time."""
    from tfhash.index import MilvusIndex

    if not isinstance(index, MilvusIndex):
        index.add_batches(((codes, ids) for codes, _, ids in shards), shards.count)
        return
    for codes, _, ids in shards:
        index.add(codes, ids)


@component(use_beam=True)
def IndexBuilder(
    examples: InputArtifact[standard_artifacts.Examples],
    pushed_model: InputArtifact[standard_artifacts.PushedModel],
    index: OutputArtifact[BuiltIndexes],
    index_base_dir: Parameter[str],
    data_dir: Parameter[str],
    kinds: Parameter[str] = "BFlat",
    embeddings: Parameter[int] = 1,
    database_split: Parameter[str] = "database",
    modalities: Parameter[str] = "",
    milvus_uri: Parameter[str] = "",
    collection_prefix: Parameter[str] = "tfhash",
    evaluation: InputArtifact[standard_artifacts.ModelEvaluation] = None,  # optional: its cached database codes
    beam_pipeline: BeamComponentParameter[beam.Pipeline] = None,
) -> None:
    """The TFX component: encodes the database split with exactly the pushed SavedModel version and
    writes its tfhash indexes (``index_base_dir``: a folder or a URI of remote storage;
    ``data_dir``: the exported data, whose description gives the number of classes).

    Indexes (their manifest naming that version and the signature fingerprint) go to
    ``<index_base_dir>/<version>/<kind>/``, or for a cross-modal model one per database modality,
    ``<index_base_dir>/<version>/<kind>-<modality>/`` (encoded with ``serving_<modality>``). The
    database is encoded as a Beam job of code shards on the pipeline's runner; the shards the
    RetrievalEvaluator wrote with a model of the same SavedModel fingerprint are read from its
    artifact instead (:func:`tfhash.components.encoding.run_shard_jobs`). Indexes are filled from the
    shards (:func:`fill_index`) and saved, with their version lock and, unless ``embeddings`` is 0,
    the items' embeddings (the second stage of a search, :mod:`tfhash.index.refine`), once every
    shard is in.

    A ``Milvus`` index goes to the Milvus at ``milvus_uri``, into the collection
    ``<collection_prefix>_v<version>[_<modality>]`` (one per model version, so the version being served
    keeps its collection until the search service swaps; a rebuild of the same version replaces it);
    its index directory points at that collection and the collection is locked to the version.
    """
    from tfhash.index import MilvusIndex, index_factory
    from tfhash.index.factory import parse_index_type
    from tfhash.index.milvus import collection_name

    storage.makedirs(index.uri)
    if not pushed_model.get_int_custom_property("pushed"):
        logger.warning("IndexBuilder: the model was not pushed; no index is built")
        index.set_int_custom_property("built", 0)
        return
    version = pushed_model.get_string_custom_property("pushed_version")
    model_dir = pushed_model.get_string_custom_property("pushed_destination")
    fingerprint = signature_fingerprint(model_dir)
    num_classes = int(read_data_description(data_dir)["num_classes"])
    files = split_files(examples.uri, database_split)
    # one database per modality of a cross-modal model ("<type>-<modality>"), else one ("<type>")
    written = {}
    database_modalities = [m for m in modalities.split(",") if m] or [None]

    def job(modality: str | None) -> ShardJob:  # the evaluator's shards of this model when there, else its own
        signature = examples_signature(modality)
        for root in [evaluation.uri] if evaluation else []:
            cached = ShardJob(model_dir, tuple(files), num_classes, shards_dir(root, model_dir, files, num_classes, signature), signature)
            if cached.done() is not None:
                return cached
        return ShardJob(model_dir, tuple(files), num_classes, shards_dir(index.uri, model_dir, files, num_classes, signature), signature)

    jobs = [job(modality) for modality in database_modalities]
    for modality, shards in zip(database_modalities, run_shard_jobs(beam_pipeline, jobs), strict=True):
        stored = shards.embeddings() if embeddings else None
        for kind in [k.strip() for k in kinds.split(",") if k.strip()]:
            placement = {}
            if parse_index_type(kind)[0].cls is MilvusIndex:
                if not milvus_uri:
                    raise ValueError(f"IndexBuilder: index kind {kind} needs milvus_uri (a Milvus server URI or a Milvus Lite file)")
                placement = {"uri": milvus_uri, "collection": collection_name(collection_prefix, version, modality), "replace": True}
            built = index_factory(shards.manifest["code_bytes"] * 8, kind, **placement)
            try:
                fill_index(built, shards)
                path = index_dir(index_base_dir, version, kind, modality)
                built.save(path, model_version=version, signature_fingerprint=fingerprint, embeddings=stored)
            finally:
                built.close()
            written[index_name(kind, modality)] = path
    storage.write_json(storage.join(index.uri, INDEXES_FILE), {"model_version": version, "model_dir": model_dir, "indexes": written})
    index.set_int_custom_property("built", 1)
    index.set_string_custom_property("model_version", version)
