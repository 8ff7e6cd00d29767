"""gRPC client of TF Serving (``tensorflow_model_server`` or :mod:`tfhash.serving.model_server`)
for tfhash models: encode serialized tf.Examples or raw features with a pinned model version.

    client = ModelClient("localhost:8500", "tfhash-mnist", version=3)
    batch = client.encode_examples(records)          # EncodedBatch: codes, binary_codes, packed_codes
    batch = client.encode_features(images)           # the encode_features signature
    client.status()                                  # [(3, "AVAILABLE", "")]

Errors of the server come back as :class:`~tfhash.serving.errors.ServingError` with the gRPC code
(INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, DEADLINE_EXCEEDED, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from tfhash.serving.channel import ChannelClient
from tfhash.serving.errors import invalid
from tfhash.serving.requests import check_examples, check_features

from tfhash.artifacts import (
    BINARY_CODES,
    CODES,
    EXAMPLES_INPUT,
    EXAMPLES_SIGNATURE,
    FEATURES_SIGNATURE,
    PACKED_CODES,
    PIXELS_INPUT,
    PIXELS_SIGNATURE,
)

__all__ = ["ModelClient", "EncodedBatch", "describe_signature"]


@dataclass
class EncodedBatch:
    """Codes of one request and the model version that computed them."""

    codes: np.ndarray  # float32 (n, K)
    binary_codes: np.ndarray  # int8 +-1 (n, K)
    packed_codes: np.ndarray  # uint8 (n, K / 8)
    model_version: int


class ModelClient(ChannelClient):
    """One model on one server. ``version`` / ``version_label`` pin the version of every call
    (neither: the server's newest). ``timeout`` is the default deadline in seconds. ``credentials``:
    :class:`~tfhash.serving.access.ClientCredentials` of a server with TLS or a token."""

    def __init__(self, target: str, model_name: str, version: int | None = None, version_label: str | None = None,
                 timeout: float = 10.0, channel: grpc.Channel | None = None, credentials=None):  # fmt: skip
        if version is not None and version_label is not None:
            raise ValueError("pin either version or version_label, not both")
        super().__init__(target, timeout, channel, options=[("grpc.max_receive_message_length", 64 << 20)], credentials=credentials)
        self.model_name, self.version, self.version_label = model_name, version, version_label
        self._predict = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self._models = model_service_pb2_grpc.ModelServiceStub(self._channel)

    def _spec(self, message, signature_name: str | None = None) -> None:
        message.model_spec.name = self.model_name
        if self.version is not None:
            message.model_spec.version.value = int(self.version)
        elif self.version_label is not None:
            message.model_spec.version_label = self.version_label
        if signature_name:
            message.model_spec.signature_name = signature_name

    def predict(self, inputs: dict, signature_name: str = EXAMPLES_SIGNATURE, output_filter=(),
                timeout: float | None = None) -> tuple[dict, int]:  # fmt: skip
        """Raw ``Predict``: inputs name -> array (or ``TensorProto``).

        Returns:
            ``(outputs name -> array, model version that answered)``.
        """
        request = predict_pb2.PredictRequest()
        self._spec(request, signature_name)
        for name, value in inputs.items():
            proto = value if isinstance(value, tensor_pb2.TensorProto) else tf.make_tensor_proto(value)
            request.inputs[name].CopyFrom(proto)
        request.output_filter.extend(output_filter)
        response = self._call(self._predict.Predict, request, timeout)
        outputs = {name: tf.make_ndarray(proto) for name, proto in response.outputs.items()}
        return outputs, int(response.model_spec.version.value)

    def _encoded(self, outputs: dict, version: int) -> EncodedBatch:
        return EncodedBatch(outputs[CODES], outputs[BINARY_CODES], outputs[PACKED_CODES], version)

    def encode_examples(self, serialized, timeout: float | None = None) -> EncodedBatch:
        """Encode serialized raw tf.Examples with the ``serving_default`` signature (checked here
        first: :func:`tfhash.serving.requests.check_examples`)."""
        records = check_examples(serialized)
        if not records:
            raise invalid("no examples to encode")
        return self._encoded(*self.predict({EXAMPLES_INPUT: np.array(records, dtype=object)}, EXAMPLES_SIGNATURE,
                                           timeout=timeout))  # fmt: skip

    def encode_features(self, features, input_name: str | None = None, timeout: float | None = None) -> EncodedBatch:
        """Encode raw model inputs (batch first) with the ``encode_features`` signature.
        ``input_name`` defaults to the signature's only input."""
        array = check_features(features)
        if input_name is None:
            input_name = next(iter(self.signatures()[FEATURES_SIGNATURE]["inputs"]))
        return self._encoded(*self.predict({input_name: array}, FEATURES_SIGNATURE, timeout=timeout))

    def encode_pixels(self, images, timeout: float | None = None) -> EncodedBatch:
        """Encode raw ``uint8`` images (batch first, the size the model takes) with the
        ``encode_pixels`` signature of an image model."""
        array = np.asarray(images)
        if array.dtype != np.uint8:
            raise invalid(f"encode_pixels takes uint8 pixels, got {array.dtype}; decoded images are 0..255 uint8")
        return self._encoded(*self.predict({PIXELS_INPUT: array}, PIXELS_SIGNATURE, timeout=timeout))

    def signature_defs(self, timeout: float | None = None) -> tuple[dict, int]:
        """``GetModelMetadata``: (signature name -> ``SignatureDef``, version)."""
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        self._spec(request)
        response = self._call(self._predict.GetModelMetadata, request, timeout)
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        response.metadata["signature_def"].Unpack(signature_map)
        return dict(signature_map.signature_def), int(response.model_spec.version.value)

    def signatures(self) -> dict:
        """Signature name -> {"inputs"|"outputs": {tensor name: (dtype name, shape list, -1 unknown)}}."""
        return {name: describe_signature(sig) for name, sig in self.signature_defs()[0].items()}

    def status(self, timeout: float | None = None) -> list[tuple[int, str, str]]:
        """``GetModelStatus``: (version, state name, error message) of each version."""
        request = get_model_status_pb2.GetModelStatusRequest()
        self._spec(request)
        response = self._call(self._models.GetModelStatus, request, timeout)
        state_name = get_model_status_pb2.ModelVersionStatus.State.Name
        return [(int(s.version), state_name(s.state), s.status.error_message) for s in response.model_version_status]


def describe_signature(signature_def) -> dict:
    """A ``SignatureDef`` as plain data: dtype names and shapes (-1 for unknown dimensions)."""

    def tensors(mapping):
        return {name: (tf.dtypes.as_dtype(info.dtype).name, [int(d.size) for d in info.tensor_shape.dim])
                for name, info in mapping.items()}  # fmt: skip

    return {"inputs": tensors(signature_def.inputs), "outputs": tensors(signature_def.outputs)}
