"""tfhash: deep hashing for TensorFlow / Keras 3.

Submodules are imported lazily so that ``import tfhash`` stays cheap (no TensorFlow import) for
code that only needs the metrics, the data loaders or the index.

The package logger ``tfhash`` has a ``NullHandler``: the library is quiet unless the application
configures logging (the ``tfhash`` CLI does, with ``-v``). TensorFlow's and the google libraries'
start-up notices are held back unless asked for (:mod:`tfhash.startup`).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from tfhash import startup
from tfhash._version import __version__

logging.getLogger(__name__).addHandler(logging.NullHandler())
startup.hold_back()

#: The public modules (each documented in the API reference, docs/reference/).
_SUBMODULES = (
    "codes",
    "labels",
    "data",
    "metrics",
    "layers",
    "losses",
    "models",
    "callbacks",
    "proxies",
    "export",
    "index",
    "recipes",
    "tuning",
    "fine_tuning",
    "registry",
    "artifacts",
)

#: The TFX artifact types of the pipeline's components, which a Kubeflow pod imports as
#: ``tfhash.<name>`` (:mod:`tfhash.artifact_types`).
_ARTIFACT_TYPES = ("RecordReport", "BuiltIndexes")

__all__ = ["__version__", *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"tfhash.{name}")
    if name in _ARTIFACT_TYPES:
        return importlib.import_module("tfhash.artifact_types").TYPES[name]
    raise AttributeError(f"module 'tfhash' has no attribute {name!r}")
