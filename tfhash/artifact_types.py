"""The TFX artifact types of tfhash's pipeline components, named ``tfhash.<Type>``.

A Kubeflow pod's TFX entrypoint rebuilds each artifact's class by importing its type name, which
the Kubeflow compiler takes as ``<namespace>.<Class>``: so the types live here and the package
gives them as ``tfhash.RecordReport`` and ``tfhash.BuiltIndexes`` (imported on first use; TFX is
imported only then).
"""

from __future__ import annotations

from tfx.v1.dsl import Artifact

__all__ = ["RecordReport", "BuiltIndexes", "TYPES"]


class RecordReport(Artifact):
    """Counts of the records the RecordFilter refused, per split and reason (``report.json``)."""

    TYPE_NAME = "tfhash.RecordReport"


class BuiltIndexes(Artifact):
    """The tfhash indexes the IndexBuilder built for one pushed model version (``indexes.json``)."""

    TYPE_NAME = "tfhash.BuiltIndexes"


#: The types by their class name: what ``tfhash.<name>`` resolves to.
TYPES = {cls.__name__: cls for cls in (RecordReport, BuiltIndexes)}
