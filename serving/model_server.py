"""Development model server: TF Serving's ``PredictionService`` and ``ModelService`` gRPC APIs,
implemented in process over the SavedModel versions under each model's base path.

It stands in for ``tensorflow_model_server`` where that binary cannot run (no Docker, no TF Serving
package here), so that clients, tests and users have a real gRPC endpoint speaking the same protos.
It is not a replacement: no server-side batching, no warmup replay, one process. In production run
the official server with the artifacts of :mod:`tfhash.serving.deployment`.

What it does as TF Serving does: reads the same ``models.config`` (``model_version_policy``
latest / all / specific, ``version_labels``); polls the base paths and loads new versions, unloads
those that leave the policy; ``Predict`` (with ``output_filter``), ``GetModelMetadata``
(``signature_def``), ``GetModelStatus`` and ``HandleReloadConfigRequest``; bad requests get
INVALID_ARGUMENT, unknown models / versions NOT_FOUND. A version that fails to load is reported
by ``GetModelStatus`` (state END with the error) and retried when its folder changes.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    status_pb2,
)
from tfhash.serving.errors import ServingError, invalid, not_found
from tfhash.serving.grpc_server import LOOPBACK, build_server
from tfhash.serving.versions import list_versions, select_versions

logger = logging.getLogger(__name__)

DEFAULT_SIGNATURE = "serving_default"
#: tf.errors codes are the canonical gRPC codes.
_GRPC_CODE = {code.value[0]: code for code in grpc.StatusCode}


@dataclass(frozen=True)
class LoadedVersion:
    """One loaded SavedModel version: its concrete signature functions and SignatureDefs."""

    version: int
    path: str
    module: object
    signature_defs: dict

    def signature(self, name: str):
        name = name or DEFAULT_SIGNATURE
        if name not in self.module.signatures:
            raise invalid(f"serving signature {name!r} not found; the model has {sorted(self.module.signatures)}")
        return self.module.signatures[name]


def load_version(path: str, version: int) -> LoadedVersion:
    """Load one SavedModel version directory (raises whatever TensorFlow raises on a bad one)."""
    module = tf.saved_model.load(path)
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as handle:
        proto.ParseFromString(handle.read())
    # the SavedModel also holds an internal "__saved_model_init_op" entry, which is no signature
    signature_defs = {k: v for k, v in proto.meta_graphs[0].signature_def.items() if k in module.signatures}
    return LoadedVersion(version, path, module, signature_defs)


def _folder_stamp(path: str) -> float:
    return os.stat(os.path.join(path, "saved_model.pb")).st_mtime


def op_error_message(err: tf.errors.OpError) -> str:
    """The first line of a TensorFlow error without the ``{{function_node ...}}`` graph names."""
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", err.message.split("\n")[0]).strip()


def run_signature(function, inputs: dict, output_filter=()) -> dict:
    """Call a signature with TensorProto inputs, checked as TF Serving checks them.

    Args:
        function: a concrete signature function of a loaded SavedModel.
        inputs: input name -> ``TensorProto``.
        output_filter: output names to return (empty: all).

    Returns:
        output name -> NumPy array.

    Raises:
        ServingError: INVALID_ARGUMENT for missing, unexpected or malformed inputs, a dtype or shape
            that the signature does not accept, or an op that rejects the values (e.g. a serialized
            tf.Example that does not parse); other TensorFlow errors with their own code.
    """
    specs = function.structured_input_signature[1]
    missing, extra = set(specs) - set(inputs), set(inputs) - set(specs)
    if missing or extra:
        raise invalid(f"the signature takes inputs {sorted(specs)}; missing {sorted(missing)}, unexpected {sorted(extra)}")
    outputs = set(function.structured_outputs)
    unknown_outputs = set(output_filter) - outputs
    if unknown_outputs:
        raise invalid(f"output_filter names {sorted(unknown_outputs)}, the signature has {sorted(outputs)}")
    arguments = {}
    for name, spec in specs.items():
        proto = inputs[name]
        if proto.dtype != spec.dtype.as_datatype_enum:
            raise invalid(f"input {name!r}: expects {spec.dtype.name}, got {tf.dtypes.as_dtype(proto.dtype).name}"
                          if proto.dtype else f"input {name!r}: the tensor has no dtype")  # fmt: skip
        try:
            value = tf.make_ndarray(proto)
        except (ValueError, TypeError) as err:
            raise invalid(f"input {name!r}: malformed TensorProto ({err})") from err
        if not spec.shape.is_compatible_with(value.shape):
            raise invalid(f"input {name!r}: shape {list(value.shape)} does not match {spec.shape}")
        arguments[name] = tf.constant(value, dtype=spec.dtype)
    try:
        result = function(**arguments)
    except tf.errors.OpError as err:
        raise ServingError(_GRPC_CODE.get(err.error_code, grpc.StatusCode.INTERNAL), op_error_message(err)) from err
    except UnicodeDecodeError as err:
        # TensorFlow fails to build its own error message when it quotes undecodable input bytes
        # (a malformed serialized example): the op rejected the input either way.
        raise invalid("the input was rejected by the model's parsing ops (malformed serialized data)") from err
    wanted = set(output_filter) or outputs
    return {name: tensor.numpy() for name, tensor in result.items() if name in wanted}


class ModelRegistry:
    """The loaded versions of every model in a ``ModelServerConfig``; :meth:`poll` syncs them with
    the base paths. Readers see an immutable snapshot, swapped in whole after each poll."""

    def __init__(self, server_config):
        self._poll_lock = threading.Lock()
        self._configs = {c.name: c for c in server_config.model_config_list.config}
        self._loaded: dict[str, dict[int, LoadedVersion]] = {name: {} for name in self._configs}
        self._failed: dict[tuple[str, int], tuple[float, str]] = {}

    def reload_config(self, server_config) -> None:
        with self._poll_lock:
            self._configs = {c.name: c for c in server_config.model_config_list.config}
            self._loaded = {name: self._loaded.get(name, {}) for name in self._configs}
        self.poll()

    def poll(self) -> None:
        """Load the versions each policy wants and that are not loaded yet; drop the others."""
        with self._poll_lock:
            snapshot = {}
            for name, config in self._configs.items():
                current = self._loaded.get(name, {})
                wanted = select_versions(list_versions(config.base_path), config.model_version_policy)
                versions = {v: current[v] for v in wanted if v in current}
                for version in wanted:
                    if version not in versions:
                        loaded = self._try_load(name, os.path.join(config.base_path, str(version)), version)
                        if loaded is not None:
                            versions[version] = loaded
                snapshot[name] = versions
            self._loaded = snapshot

    def _try_load(self, name: str, path: str, version: int) -> LoadedVersion | None:
        stamp = _folder_stamp(path)
        failed = self._failed.get((name, version))
        if failed and failed[0] == stamp:
            return None
        try:
            loaded = load_version(path, version)
        except Exception as err:  # any load failure is recorded and reported, never fatal
            logger.error("model %s version %d failed to load: %s", name, version, err)
            self._failed[(name, version)] = (stamp, f"{type(err).__name__}: {err}")
            return None
        self._failed.pop((name, version), None)
        logger.info("model %s: loaded version %d from %s", name, version, path)
        return loaded

    def resolve(self, spec) -> LoadedVersion:
        """The loaded version a ``ModelSpec`` names (version, version label, or the newest)."""
        if spec.name not in self._configs:
            raise not_found(f"model {spec.name!r} is not served (served: {sorted(self._configs)})")
        versions = self._loaded.get(spec.name, {})
        choice = spec.WhichOneof("version_choice")
        if choice == "version_label":
            labels = self._configs[spec.name].version_labels
            if spec.version_label not in labels:
                raise invalid(f"model {spec.name!r} has no version label {spec.version_label!r}")
            version = labels[spec.version_label]
        elif choice == "version":
            version = spec.version.value
        else:
            if not versions:
                raise not_found(f"model {spec.name!r} has no version loaded")
            version = max(versions)
        if version not in versions:
            raise not_found(f"model {spec.name!r} version {version} is not loaded (loaded: {sorted(versions)})")
        return versions[version]

    def statuses(self, spec) -> list:
        """``ModelVersionStatus`` of each loaded or failed version (only the asked one, if any)."""
        if spec.name not in self._configs:
            raise not_found(f"model {spec.name!r} is not served (served: {sorted(self._configs)})")
        states = {v: get_model_status_pb2.ModelVersionStatus(
            version=v, state=get_model_status_pb2.ModelVersionStatus.AVAILABLE, status=status_pb2.StatusProto(error_code=0))
            for v in self._loaded.get(spec.name, {})}  # fmt: skip
        for (name, version), (_, message) in self._failed.items():
            if name == spec.name and version not in states:
                states[version] = get_model_status_pb2.ModelVersionStatus(
                    version=version, state=get_model_status_pb2.ModelVersionStatus.END,
                    status=status_pb2.StatusProto(error_code=2, error_message=message))  # fmt: skip
        if spec.WhichOneof("version_choice") is not None:
            version = self.resolve(spec).version if spec.WhichOneof("version_choice") == "version_label" else spec.version.value
            if version not in states:
                raise not_found(f"model {spec.name!r} version {version} is not loaded")
            return [states[version]]
        return [states[v] for v in sorted(states)]


def _abort(context, err: ServingError):
    context.abort(err.code, err.message)


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    """``Predict`` and ``GetModelMetadata``; Classify / Regress / MultiInference stay UNIMPLEMENTED
    (tfhash models export Predict signatures only)."""

    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    def Predict(self, request, context):
        try:
            loaded = self.registry.resolve(request.model_spec)
            outputs = run_signature(loaded.signature(request.model_spec.signature_name), dict(request.inputs),
                                    list(request.output_filter))  # fmt: skip
        except ServingError as err:
            _abort(context, err)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = loaded.version
        response.model_spec.signature_name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        for name, value in outputs.items():
            response.outputs[name].CopyFrom(tf.make_tensor_proto(np.asarray(value)))
        return response

    def GetModelMetadata(self, request, context):
        try:
            if list(request.metadata_field) != ["signature_def"]:
                raise invalid(f"metadata_field must be ['signature_def'], got {list(request.metadata_field)}")
            loaded = self.registry.resolve(request.model_spec)
        except ServingError as err:
            _abort(context, err)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = loaded.version
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for name, signature_def in loaded.signature_defs.items():
            signature_map.signature_def[name].CopyFrom(signature_def)
        response.metadata["signature_def"].Pack(signature_map)
        return response


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, registry: ModelRegistry):
        self.registry = registry

    def GetModelStatus(self, request, context):
        try:
            statuses = self.registry.statuses(request.model_spec)
        except ServingError as err:
            _abort(context, err)
        return get_model_status_pb2.GetModelStatusResponse(model_version_status=statuses)

    def HandleReloadConfigRequest(self, request, context):
        if not request.config.model_config_list.config:
            _abort(context, invalid("the new config names no model"))
        self.registry.reload_config(request.config)
        return model_management_pb2.ReloadConfigResponse(status=status_pb2.StatusProto(error_code=0))


class DevModelServer:
    """The development model server: a gRPC server plus a thread that polls the base paths.

    ``start()`` loads what is there before it returns, so a client can call it at once.
    """

    def __init__(self, server_config, host: str = LOOPBACK, port: int = 0, poll_seconds: float = 1.0,
                 max_workers: int = 8, max_message_bytes: int = 64 << 20):  # fmt: skip
        self.registry = ModelRegistry(server_config)
        self.poll_seconds = float(poll_seconds)
        self._server, self.port = build_server(host, port, max_workers, max_message_bytes)
        self.host = host
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionServicer(self.registry), self._server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(self.registry), self._server)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="tfhash-model-poll", daemon=True)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _poll_loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.registry.poll()
            except Exception:  # a poll failure must not kill the poller
                logger.exception("model poll failed")

    def start(self) -> DevModelServer:
        self.registry.poll()
        self._server.start()
        self._poller.start()
        logger.info("development model server on %s", self.address)
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Stop polling, refuse new RPCs and let in-flight ones finish for up to ``grace`` seconds."""
        self._stop.set()
        self._server.stop(grace).wait()
