"""Encoders of the search service: one model version that turns a query's checked inputs
(:class:`tfhash.serving.requests.Query`) into packed codes, either in process (the SavedModel
loaded here) or through TF Serving (a :class:`ModelClient` pinned to that version). The
SavedModel signs and packs (its ``packed_codes`` output); its continuous ``codes`` come back beside
them only to refuse an input that encodes to NaN or infinite codes (a finite input can overflow
inside the network), which the packed bits would hide."""

from __future__ import annotations

import abc

import grpc
import numpy as np
import tensorflow as tf
from tfhash.serving.client import ModelClient, describe_signature
from tfhash.serving.errors import ServingError, invalid, unavailable
from tfhash.serving.model_server import LoadedVersion, load_version, run_signature

from tfhash.artifacts import (
    CODES,
    EXAMPLES_INPUT,
    EXAMPLES_SIGNATURE,
    FEATURES_SIGNATURE,
    PACKED_CODES,
    examples_signature,
    features_signature,
)

__all__ = ["Encoder", "InProcessEncoder", "RemoteEncoder"]


#: The outputs an encoder asks for: the packed codes it answers with, the continuous ones it checks.
OUTPUTS = (PACKED_CODES, CODES)


def shape_matches(shape, expected) -> bool:
    """``shape`` fits a signature shape where -1 is any size."""
    return len(shape) == len(expected) and all(e < 0 or e == s for s, e in zip(shape, expected, strict=True))


class Encoder(abc.ABC):
    """A model version that encodes serialized examples or raw features to continuous codes, with
    the default signatures, or those of one modality of a cross-modal model
    (``serving_<modality>`` / ``encode_<modality>``)."""

    version: int
    signatures: dict
    examples_signature: str = EXAMPLES_SIGNATURE
    features_signature: str = FEATURES_SIGNATURE

    def _use_modality(self, query_modality: str | None) -> None:
        """Pick the signatures of ``query_modality`` (None: the defaults); refuse unknown ones."""
        if query_modality:
            self.examples_signature, self.features_signature = examples_signature(query_modality), features_signature(query_modality)
        for name in (self.examples_signature, self.features_signature):
            if name not in self.signatures:
                raise ValueError(f"model version {self.version} has no signature {name!r} (it has {sorted(self.signatures)})")

    @abc.abstractmethod
    def _predict(self, signature_name: str, inputs: dict, timeout: float | None) -> tuple[np.ndarray, np.ndarray]:
        """The :data:`OUTPUTS` of one call: ``(packed codes, continuous codes)``."""

    @abc.abstractmethod
    def describe(self) -> str: ...

    @property
    def bits(self) -> int:
        return int(self.signatures[self.examples_signature]["outputs"][CODES][1][-1])

    def encode_examples(self, serialized: list[bytes], timeout: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(packed codes, continuous codes)`` of serialized examples that
        :func:`~tfhash.serving.requests.check_examples` passed."""
        if not serialized:
            raise invalid("no examples in the request")
        return self._checked(self._predict(self.examples_signature, {EXAMPLES_INPUT: np.array(serialized, dtype=object)}, timeout))

    def encode_features(self, features: np.ndarray, timeout: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(packed codes, continuous codes)`` of float32 features that :func:`~tfhash.serving.requests.check_features`
        passed; a shape the model does not take is refused."""
        ((name, (_, expected)),) = self.signatures[self.features_signature]["inputs"].items()
        if not shape_matches(features.shape, expected):
            raise invalid(f"features have shape {list(features.shape)}; the model takes {expected} (-1: any)")
        return self._checked(self._predict(self.features_signature, {name: features}, timeout))

    @staticmethod
    def _checked(outputs: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        packed, codes = outputs
        if not np.all(np.isfinite(codes)):
            raise invalid("the input encodes to NaN or infinite codes (non-finite feature values?)")
        return np.asarray(packed, dtype=np.uint8), np.asarray(codes, dtype=np.float32)


class InProcessEncoder(Encoder):
    """The SavedModel version at ``path``, loaded in this process (concurrent requests are joined
    before they reach it: :mod:`tfhash.serving.batching`)."""

    def __init__(self, path: str, version: int, loaded: LoadedVersion | None = None, query_modality: str | None = None):
        self.loaded = loaded or load_version(path, int(version))
        self.version = int(version)
        self.signatures = {name: describe_signature(s) for name, s in self.loaded.signature_defs.items()}
        self._use_modality(query_modality)

    def _predict(self, signature_name, inputs, timeout):
        protos = {name: tf.make_tensor_proto(value) for name, value in inputs.items()}
        outputs = run_signature(self.loaded.signature(signature_name), protos, list(OUTPUTS))
        return tuple(outputs[name] for name in OUTPUTS)

    def describe(self) -> str:
        return f"in-process SavedModel version {self.version}"


class RemoteEncoder(Encoder):
    """Version ``version`` of ``model_name`` on a TF Serving endpoint (every call pins it);
    ``credentials``: :class:`~tfhash.serving.access.ClientCredentials` of a server that asks for them."""

    def __init__(self, target: str, model_name: str, version: int, timeout: float = 10.0, channel=None,
                 query_modality: str | None = None, credentials=None):  # fmt: skip
        self.client = ModelClient(target, model_name, version=int(version), timeout=timeout, channel=channel, credentials=credentials)
        self.version = int(version)
        signature_defs, _ = self.client.signature_defs()
        self.signatures = {name: describe_signature(s) for name, s in signature_defs.items()}
        self._use_modality(query_modality)

    def _predict(self, signature_name, inputs, timeout):
        try:
            outputs, version = self.client.predict(inputs, signature_name, list(OUTPUTS), timeout)
        except ServingError as err:
            if err.code == grpc.StatusCode.NOT_FOUND:  # TF Serving unloaded the version this pair needs
                raise unavailable(f"TF Serving no longer serves version {self.version}: {err.message}") from err
            if err.code == grpc.StatusCode.UNAVAILABLE:  # down or restarting: codes are still searched
                raise unavailable(f"the model server {self.client.target} cannot encode the query ({err.message}); queries of "
                                  "codes are still answered") from err  # fmt: skip
            raise
        if version != self.version:  # a pinned request answered by another version: never use it
            raise unavailable(f"TF Serving answered with version {version}, expected {self.version}")
        return tuple(outputs[name] for name in OUTPUTS)

    def describe(self) -> str:
        return f"TF Serving {self.client.target} model {self.client.model_name} version {self.version}"
