"""IndexBuilder: encodes the database split with exactly the pushed SavedModel version and writes
tfhash indexes (manifest naming that version and the signature fingerprint) next to it:
``<index_base_dir>/<version>/<kind>/``, or for a cross-modal model one per database modality,
``<index_base_dir>/<version>/<kind>-<modality>/`` (encoded with ``serving_<modality>``). Codes
the RetrievalEvaluator computed with a model of the same SavedModel fingerprint are read from its
artifact instead of being encoded again (:func:`tfhash.components.encoding.encode_split_cached`)."""


import json
import logging
import os

from tfhash.components.encoding import encode_split_cached, split_files
from tfhash.components.export import signature_fingerprint
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.types import artifact, standard_artifacts

logger = logging.getLogger(__name__)


class HashIndex(artifact.Artifact):
    """The tfhash indexes built for one pushed model version."""

    TYPE_NAME = "tfhash.HashIndex"


@component
def IndexBuilder(
    examples: InputArtifact[standard_artifacts.Examples],
    pushed_model: InputArtifact[standard_artifacts.PushedModel],
    index: OutputArtifact[HashIndex],
    index_base_dir: Parameter[str],
    num_classes: Parameter[int] = 10,
    kinds: Parameter[str] = "BFlat",
    database_split: Parameter[str] = "database",
    modalities: Parameter[str] = "",
    evaluation: InputArtifact[standard_artifacts.ModelEvaluation] = None,  # optional: its cached database codes
) -> None:
    from tfhash.index import index_factory

    os.makedirs(index.uri, exist_ok=True)
    if not pushed_model.get_int_custom_property("pushed"):
        logger.warning("IndexBuilder: the model was not pushed; no index is built")
        index.set_int_custom_property("built", 0)
        return
    version = pushed_model.get_string_custom_property("pushed_version")
    model_dir = pushed_model.get_string_custom_property("pushed_destination")
    fingerprint = signature_fingerprint(model_dir)
    files = split_files(examples.uri, database_split)
    # one database per modality of a cross-modal model ("<kind>-<modality>"), else one ("<kind>")
    databases = {f"-{m}": f"serving_{m}" for m in modalities.split(",") if m} or {"": "serving_default"}
    written = {}
    for suffix, signature in databases.items():
        codes, _, ids = encode_split_cached(model_dir, files, num_classes, evaluation.uri if evaluation else None, signature)
        for kind in [k.strip() for k in kinds.split(",") if k.strip()]:
            built = index_factory(codes.shape[1] * 8, kind)
            built.add(codes, ids)
            path = os.path.join(index_base_dir, version, kind + suffix)
            built.save(path, model_version=version, signature_fingerprint=fingerprint)
            written[kind + suffix] = path
    with open(os.path.join(index.uri, "indexes.json"), "w") as handle:
        json.dump({"model_version": version, "model_dir": model_dir, "indexes": written}, handle, indent=2)
    index.set_int_custom_property("built", 1)
    index.set_string_custom_property("model_version", version)
