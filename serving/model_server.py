"""Development model server: TF Serving's ``PredictionService`` and ``ModelService`` gRPC APIs,
implemented in process over the SavedModel versions under each model's base path."""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2
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
from tfhash.serving.access import Access
from tfhash.serving.deployment import read_models_config
from tfhash.serving.errors import (
    ServingError,
    answers_errors,
    invalid,
    not_found,
    permission_denied,
    quoted_value,
    too_large,
)
from tfhash.serving.grpc_server import LOOPBACK, GrpcServer
from tfhash.serving.versions import Retries, select_versions, tree_stamp

from tfhash import storage
from tfhash.artifacts import EXAMPLES_SIGNATURE, list_versions, model_version_dir

__all__ = ["LoadedVersion", "load_version", "tensor_value", "run_signature", "ModelRegistry", "DevModelServer"]


logger = logging.getLogger(__name__)

#: tf.errors codes are the canonical gRPC codes.
_GRPC_CODE = {code.value[0]: code for code in grpc.StatusCode}
#: The TensorProto field that carries each dtype's values when ``tensor_content`` is not used.
_VALUE_FIELD = {
    types_pb2.DT_FLOAT: "float_val", types_pb2.DT_DOUBLE: "double_val", types_pb2.DT_HALF: "half_val",
    types_pb2.DT_BFLOAT16: "half_val", types_pb2.DT_INT8: "int_val", types_pb2.DT_INT16: "int_val",
    types_pb2.DT_INT32: "int_val", types_pb2.DT_UINT8: "int_val", types_pb2.DT_UINT16: "int_val",
    types_pb2.DT_INT64: "int64_val", types_pb2.DT_UINT32: "uint32_val", types_pb2.DT_UINT64: "uint64_val",
    types_pb2.DT_BOOL: "bool_val", types_pb2.DT_STRING: "string_val",
}  # fmt: skip
MAX_RANK = 32


@dataclass(frozen=True)
class LoadedVersion:
    """One loaded SavedModel version: its concrete signature functions and SignatureDefs."""

    version: int
    path: str
    module: object
    signature_defs: dict

    def signature(self, name: str):
        name = name or EXAMPLES_SIGNATURE
        if name not in self.module.signatures:
            raise invalid(f"serving signature {quoted_value(name)} not found; the model has {sorted(self.module.signatures)}")
        return self.module.signatures[name]


def load_version(path: str, version: int) -> LoadedVersion:
    """Load one SavedModel version directory, a folder or a URI (raises whatever TensorFlow raises
    on a bad one)."""
    module = tf.saved_model.load(path)
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString(storage.read_bytes(storage.join(path, "saved_model.pb")))
    # the SavedModel also holds an internal "__saved_model_init_op" entry, which is no signature
    signature_defs = {k: v for k, v in proto.meta_graphs[0].signature_def.items() if k in module.signatures}
    return LoadedVersion(version, path, module, signature_defs)


#: Lines of a TensorFlow error message that say where, not what: its header, the "Detected at node
#: ... defined at" line with its stack (or "<stack traces unavailable>"); indented lines (stack
#: frames, ``[[node ...]]``) are skipped too.
_WHERE_LINES = re.compile(r"Graph execution error:$|Detected at node .* defined at|<stack traces unavailable>$")


def op_error_message(err: tf.errors.OpError) -> str:
    """The first line of a TensorFlow error that says what failed, without ``{{function_node ...}}``
    graph names, at most 300 characters."""
    lines = [line for line in err.message.splitlines() if line.strip() and not line[0].isspace() and not _WHERE_LINES.match(line)]
    return re.sub(r"\{\{function_node [^}]*\}\}\s*", "", (lines or [err.message])[0]).strip()[:300]


def _dtype_name(enum: int) -> str:
    try:
        return tf.dtypes.as_dtype(enum).name
    except TypeError:
        return f"unknown dtype {enum}"


def tensor_value(proto, spec: tf.TensorSpec, name: str, max_bytes: int) -> np.ndarray:
    """A request ``TensorProto`` as the array the signature input ``spec`` takes. Dtype, shape,
    size (at most ``max_bytes``) and the number of values sent are checked before the array
    is materialised.

    Raises:
        ServingError: INVALID_ARGUMENT for a wrong dtype or shape, or values missing or extra;
            RESOURCE_EXHAUSTED for a tensor over ``max_bytes``.
    """
    if proto.dtype != spec.dtype.as_datatype_enum:
        raise invalid(f"input {name!r}: expects {spec.dtype.name}, got {_dtype_name(proto.dtype)}")
    if proto.tensor_shape.unknown_rank or len(proto.tensor_shape.dim) > MAX_RANK:
        raise invalid(f"input {name!r}: the tensor needs a known shape of at most {MAX_RANK} dimensions")
    shape = [int(d.size) for d in proto.tensor_shape.dim]
    if any(d < 0 for d in shape) or not spec.shape.is_compatible_with(shape):
        raise invalid(f"input {name!r}: shape {shape} does not match {spec.shape}")
    count = math.prod(shape)
    itemsize = 1 if spec.dtype == tf.string else spec.dtype.size
    if count * itemsize > max_bytes:
        raise too_large(f"input {name!r}: shape {shape} holds {count} values; this server takes tensors of at most {max_bytes} bytes")
    if proto.dtype not in _VALUE_FIELD:
        raise invalid(f"input {name!r}: dtype {spec.dtype.name} is not supported by this server")
    if proto.tensor_content and spec.dtype != tf.string:
        sent = len(proto.tensor_content) / itemsize
    else:
        sent = len(getattr(proto, _VALUE_FIELD[proto.dtype]))
    if sent != count:
        raise invalid(f"input {name!r}: shape {shape} needs {count} values, the tensor carries {sent:g} (send every value)")
    try:
        return tf.make_ndarray(proto)
    except (ValueError, TypeError) as err:
        raise invalid(f"input {name!r}: malformed TensorProto ({err})") from err


def run_signature(function, inputs: dict, output_filter=(), max_tensor_bytes: int = 64 << 20) -> dict:
    """Call a signature with TensorProto inputs, checked as TF Serving checks them (and
    :func:`tensor_value`).

    Args:
        function: a concrete signature function of a loaded SavedModel.
        inputs: input name -> ``TensorProto``.
        output_filter: output names to return (empty: all).
        max_tensor_bytes: the largest input tensor accepted.

    Returns:
        output name -> NumPy array.

    Raises:
        ServingError: INVALID_ARGUMENT for missing, unexpected or malformed inputs, a dtype or shape
            that the signature does not accept, or an op that rejects the values (a serialized
            tf.Example that does not parse, a value the exported signature's checks refuse);
            RESOURCE_EXHAUSTED for an input over the size limit; other TensorFlow errors with their
            own code.
    """
    specs = function.structured_input_signature[1]
    missing, extra = set(specs) - set(inputs), set(inputs) - set(specs)
    if missing or extra:
        raise invalid(f"the signature takes inputs {sorted(specs)}; missing {sorted(missing)}, unexpected {[quoted_value(e) for e in sorted(extra)][:5]}")
    outputs = set(function.structured_outputs)
    unknown_outputs = set(output_filter) - outputs
    if unknown_outputs:
        raise invalid(f"output_filter names {[quoted_value(o) for o in sorted(unknown_outputs)][:5]}, the signature has {sorted(outputs)}")
    arguments = {name: tf.constant(tensor_value(inputs[name], spec, name, max_tensor_bytes), dtype=spec.dtype)
                 for name, spec in specs.items()}  # fmt: skip
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


def within_root(root: str):
    """A test of whether a base path lies under ``root``: a folder (symbolic links followed) or a
    URI prefix (``gs://bucket/models``: the same scheme and bucket, and whole path segments)."""
    if storage.is_uri(root):
        prefix = root.rstrip("/") + "/"
        return lambda path: storage.is_uri(path) and (path.rstrip("/") + "/").startswith(prefix)
    folder = os.path.realpath(root)
    return lambda path: not storage.is_uri(path) and os.path.commonpath([folder, os.path.realpath(path)]) == folder


def check_server_config(server_config, allowed_root: str | None = None) -> None:
    """Refuse a ``ModelServerConfig`` that names no model, a model twice, a model without a name
    or base path, another platform than TensorFlow, or (with ``allowed_root``) a base path outside
    that folder."""
    configs = list(server_config.model_config_list.config)
    if not configs:
        raise invalid("the config names no model (model_config_list is empty)")
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise invalid(f"the config names a model twice: {[quoted_value(n) for n in names][:8]}")
    root = within_root(allowed_root) if allowed_root else None
    for config in configs:
        if not config.name or "/" in config.name or not config.base_path:
            raise invalid(f"every model needs a name without '/' and a base_path; got name {quoted_value(config.name)}")
        if config.model_platform not in ("", "tensorflow"):
            raise invalid(f"model {quoted_value(config.name)}: platform {quoted_value(config.model_platform)} is not served (only 'tensorflow')")
        if root is not None and not root(config.base_path):
            raise ServingError(grpc.StatusCode.PERMISSION_DENIED,
                               f"model {quoted_value(config.name)}: base_path is outside the folder this server may load from")  # fmt: skip


class ModelRegistry:
    """The loaded versions of every model in a ``ModelServerConfig``; :meth:`poll` syncs them with
    the base paths. Readers see an immutable snapshot, swapped in whole after each poll."""

    def __init__(self, server_config, retries: Retries | None = None):
        check_server_config(server_config)
        self._poll_lock = threading.Lock()
        self._configs = {c.name: c for c in server_config.model_config_list.config}
        self._loaded: dict[str, dict[int, LoadedVersion]] = {name: {} for name in self._configs}
        self.retries = retries or Retries()

    def reload_config(self, server_config, allowed_root: str | None = None) -> None:
        """Serve ``server_config`` from now on (checked by :func:`check_server_config`)."""
        check_server_config(server_config, allowed_root)
        with self._poll_lock:
            previous = self._configs
            self._configs = {c.name: c for c in server_config.model_config_list.config}
            for name in sorted(set(previous) - set(self._configs)):
                logger.info("model %s: unloaded versions %s (no longer in the model config)", name, sorted(self._loaded.get(name, {})))
            # versions loaded from another folder than the model's new base path are not kept
            self._loaded = {name: self._loaded.get(name, {}) if name in previous and previous[name].base_path == config.base_path else {}
                            for name, config in self._configs.items()}  # fmt: skip
        self.poll()

    def poll(self) -> None:
        """Load the versions each policy wants and that are not loaded yet; drop the others."""
        with self._poll_lock:
            snapshot, wanted_keys = {}, set()
            for name, config in self._configs.items():
                current = self._loaded.get(name, {})
                wanted = select_versions(list_versions(config.base_path), config.model_version_policy)
                versions = {v: current[v] for v in wanted if v in current}
                for version in wanted:
                    wanted_keys.add((name, version))
                    if version not in versions:
                        loaded = self._try_load(name, config.base_path, version)
                        if loaded is not None:
                            versions[version] = loaded
                for version in sorted(set(current) - set(versions)):
                    logger.info("model %s: unloaded version %d (no longer in its version policy or folder)", name, version)
                snapshot[name] = versions
            self._loaded = snapshot
            for key in set(self.retries.errors()) - wanted_keys:  # versions that left the policy
                self.retries.succeeded(key)

    def _try_load(self, name: str, base_path: str, version: int) -> LoadedVersion | None:
        path = model_version_dir(base_path, version)
        stamp = tree_stamp(path)
        if not self.retries.due((name, version), stamp):
            return None
        try:
            loaded = load_version(path, version)
        except Exception as err:  # any load failure is recorded, reported and retried, never fatal
            logger.error("model %s version %d failed to load: %s", name, version, err)
            message = f"{type(err).__name__}: {err}"
            for prefix in {base_path} if storage.is_uri(base_path) else {os.path.realpath(base_path), os.path.abspath(base_path), base_path}:
                message = message.replace(prefix, "<base_path>")
            self.retries.failed((name, version), stamp, message)
            return None
        self.retries.succeeded((name, version))
        logger.info("model %s: loaded version %d from %s", name, version, path)
        return loaded

    def resolve(self, spec) -> LoadedVersion:
        """The loaded version a ``ModelSpec`` names (version, version label, or the newest)."""
        if spec.name not in self._configs:
            raise not_found(f"model {quoted_value(spec.name)} is not served (served: {sorted(self._configs)})")
        versions = self._loaded.get(spec.name, {})
        choice = spec.WhichOneof("version_choice")
        if choice == "version_label":
            labels = self._configs[spec.name].version_labels
            if spec.version_label not in labels:
                raise invalid(f"model {spec.name!r} has no version label {quoted_value(spec.version_label)}")
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
            raise not_found(f"model {quoted_value(spec.name)} is not served (served: {sorted(self._configs)})")
        states = {v: get_model_status_pb2.ModelVersionStatus(
            version=v, state=get_model_status_pb2.ModelVersionStatus.AVAILABLE, status=status_pb2.StatusProto(error_code=0))
            for v in self._loaded.get(spec.name, {})}  # fmt: skip
        for (name, version), message in self.retries.errors().items():
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


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    """``Predict`` and ``GetModelMetadata``; Classify / Regress / MultiInference stay UNIMPLEMENTED
    (tfhash models export Predict signatures only)."""

    def __init__(self, registry: ModelRegistry, max_tensor_bytes: int):
        self.registry, self.max_tensor_bytes = registry, int(max_tensor_bytes)

    @answers_errors
    def Predict(self, request, context):
        loaded = self.registry.resolve(request.model_spec)
        outputs = run_signature(loaded.signature(request.model_spec.signature_name), dict(request.inputs),
                                list(request.output_filter), self.max_tensor_bytes)  # fmt: skip
        response = predict_pb2.PredictResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = loaded.version
        response.model_spec.signature_name = request.model_spec.signature_name or EXAMPLES_SIGNATURE
        for name, value in outputs.items():
            response.outputs[name].CopyFrom(tf.make_tensor_proto(np.asarray(value)))
        return response

    @answers_errors
    def GetModelMetadata(self, request, context):
        if list(request.metadata_field) != ["signature_def"]:
            raise invalid(f"metadata_field must be ['signature_def'], got {[quoted_value(f) for f in request.metadata_field][:5]}")
        loaded = self.registry.resolve(request.model_spec)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = request.model_spec.name
        response.model_spec.version.value = loaded.version
        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for name, signature_def in loaded.signature_defs.items():
            signature_map.signature_def[name].CopyFrom(signature_def)
        response.metadata["signature_def"].Pack(signature_map)
        return response


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    """``GetModelStatus``, and ``HandleReloadConfigRequest`` only with ``reload_api`` (else PERMISSION_DENIED)."""

    def __init__(self, registry: ModelRegistry, allowed_root: str | None = None, reload_api: bool = False):
        self.registry, self.allowed_root, self.reload_api = registry, allowed_root, reload_api

    @answers_errors
    def GetModelStatus(self, request, context):
        return get_model_status_pb2.GetModelStatusResponse(model_version_status=self.registry.statuses(request.model_spec))

    @answers_errors
    def HandleReloadConfigRequest(self, request, context):
        if not self.reload_api:
            raise permission_denied("this server's config reload API is off: start it with --reload-api to let clients replace "
                                    "its models (and --allowed-model-root to confine them)")  # fmt: skip
        self.registry.reload_config(request.config, self.allowed_root)
        return model_management_pb2.ReloadConfigResponse(status=status_pb2.StatusProto(error_code=0))


class DevModelServer:
    """The development model server: a gRPC server plus a thread that polls the base paths (and,
    with ``config_file``, the config file every ``config_poll_seconds``; 0: read it once).

    It stands in for ``tensorflow_model_server`` where that binary cannot run (no Docker, no TF Serving
    package here), so that clients, tests and users have a real gRPC endpoint speaking the same protos.
    It is not a replacement: no server-side batching, no warmup replay, one process. In production run
    the official server with the artifacts of :mod:`tfhash.serving.deployment`.

    What it does as TF Serving does: reads the same ``models.config`` (``model_version_policy``
    latest / all / specific, ``version_labels``) and, given its file, re-reads it when it changes
    (``--model_config_file_poll_wait_seconds``); polls the base paths, loads new versions and unloads
    those that leave the policy; ``Predict`` (with ``output_filter``), ``GetModelMetadata``
    (``signature_def``), ``GetModelStatus`` and ``HandleReloadConfigRequest``; bad requests get
    INVALID_ARGUMENT, unknown models / versions NOT_FOUND. A version that fails to load is reported
    by ``GetModelStatus`` (state END with the error, paths shown relative to the base path) and retried
    (:class:`tfhash.serving.versions.Retries`): at the next poll once its files change, so a version
    copied file by file loads when the copy is complete, else with a doubling delay.

    Where it is stricter than TF Serving, to bound what one request can cost: a request tensor must
    carry all its values (the short form that repeats the last value for the rest of a large shape is
    refused) and no tensor may hold more than ``max_message_bytes``, both checked before anything is
    allocated; ``HandleReloadConfigRequest`` is refused (PERMISSION_DENIED) unless ``reload_api``,
    and with ``allowed_root`` it refuses base paths outside it. ``access``: TLS and a bearer token
    as the search service's (:class:`~tfhash.serving.access.Access`); a ``host`` beyond loopback is
    refused without them unless ``access.allow_insecure``.

    ``start()`` loads what is there before it returns, so a client can call it at once.
    """

    def __init__(self, server_config, host: str = LOOPBACK, port: int = 0, poll_seconds: float = 1.0,
                 max_workers: int = 8, max_message_bytes: int = 64 << 20, config_file: str | None = None,
                 config_poll_seconds: float = 0.0, allowed_root: str | None = None, reload_api: bool = False,
                 access: Access | None = None):  # fmt: skip
        access = access or Access()
        access.check_bind(host)
        self.registry = ModelRegistry(server_config)
        self.poll_seconds, self.host = float(poll_seconds), host
        self._config_file, self._config_poll_seconds = config_file, float(config_poll_seconds)
        self._config_stamp = tree_stamp(config_file) if config_file else ()
        self._grpc = GrpcServer(host, port, max_workers, max_message_bytes, access=access.load())
        self.port = self._grpc.port
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            PredictionServicer(self.registry, max_message_bytes), self._grpc.server)  # fmt: skip
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(self.registry, allowed_root, reload_api), self._grpc.server)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, name="tfhash-model-poll", daemon=True)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _reread_config(self) -> None:
        stamp = tree_stamp(self._config_file)
        if stamp == self._config_stamp:
            return
        self._config_stamp = stamp
        try:
            self.registry.reload_config(read_models_config(self._config_file))
            logger.info("re-read the model config %s", self._config_file)
        except (ValueError, ServingError) as err:  # keep serving the config that worked
            logger.error("model config %s not applied: %s", self._config_file, err)

    def _poll_loop(self) -> None:
        next_config_read = time.monotonic() + self._config_poll_seconds
        while not self._stop.wait(self.poll_seconds):
            try:
                if self._config_file and self._config_poll_seconds > 0 and time.monotonic() >= next_config_read:
                    next_config_read = time.monotonic() + self._config_poll_seconds
                    self._reread_config()
                self.registry.poll()
            except Exception:  # a poll failure must not kill the poller
                logger.exception("model poll failed")

    def start(self) -> DevModelServer:
        self.registry.poll()
        self._grpc.start()
        self._poller.start()
        logger.info("development model server on %s", self.address)
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Stop polling, refuse new RPCs at once (UNAVAILABLE) and let in-flight ones finish for up
        to ``grace`` seconds."""
        self._stop.set()
        self._grpc.stop(grace)
