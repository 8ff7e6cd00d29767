"""TF Serving deployment artifacts for a model base directory (what the pipeline's Pusher fills).

:func:`write_deployment` writes, into one folder, the model server configs, batching and monitoring
configs and a Docker setup; given an index folder, its version policy pins only versions paired with a
published index.
"""

from __future__ import annotations

import json
import os

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2
from tfhash.serving.versions import pair_published

from tfhash import storage
from tfhash.artifacts import WARMUP_FILE, list_versions, model_version_dir

__all__ = ["model_config", "models_config", "read_models_config", "write_deployment"]


TF_SERVING_IMAGE = "tensorflow/serving:2.16.1"
PROMETHEUS_PATH = "/monitoring/prometheus/metrics"

#: Server-side batching for encode requests: batches of up to 128 examples, waiting at most 2 ms.
BATCHING_DEFAULTS = {"max_batch_size": 128, "batch_timeout_micros": 2000, "max_enqueued_batches": 64,
                     "num_batch_threads": 2}  # fmt: skip


def model_config(name: str, base_path: str, num_versions: int = 2, labels: dict[str, int] | None = None,
                 versions: list[int] | None = None):  # fmt: skip
    """One ``ModelConfig`` entry: TensorFlow platform, ``specific {versions}`` when ``versions`` is
    given, else ``latest {num_versions}``, and version labels."""
    if not name or "/" in name:
        raise ValueError(f"invalid model name {name!r}")
    if num_versions < 1:
        raise ValueError(f"num_versions must be >= 1, got {num_versions}")
    config = model_server_config_pb2.ModelConfig(name=name, base_path=base_path, model_platform="tensorflow")
    if versions is not None:
        if not versions or any(int(v) < 1 for v in versions):
            raise ValueError(f"specific versions must be positive integers, got {versions}")
        config.model_version_policy.specific.versions.extend(sorted(int(v) for v in versions))
    else:
        config.model_version_policy.latest.num_versions = num_versions
    for label, version in (labels or {}).items():
        config.version_labels[label] = int(version)
    return config


def models_config(configs) -> model_server_config_pb2.ModelServerConfig:
    server_config = model_server_config_pb2.ModelServerConfig()
    server_config.model_config_list.config.extend(configs)
    return server_config


def read_models_config(path: str) -> model_server_config_pb2.ModelServerConfig:
    """Parse a ``models.config`` text proto.

    Raises:
        ValueError: unreadable or malformed file, or no model in it.
    """
    try:
        parsed = text_format.Parse(storage.read_text(path), model_server_config_pb2.ModelServerConfig())
    except (OSError, UnicodeDecodeError, text_format.ParseError) as err:
        raise ValueError(f"{path}: cannot read the model server config ({err})") from err
    if not parsed.model_config_list.config:
        raise ValueError(f"{path}: the config names no model (model_config_list is empty)")
    return parsed


def batching_parameters_text(**overrides: int) -> str:
    """``BatchingParameters`` text proto (each field an ``Int64Value`` wrapper)."""
    unknown = set(overrides) - set(BATCHING_DEFAULTS)
    if unknown:
        raise ValueError(f"unknown batching parameters {sorted(unknown)}; known: {sorted(BATCHING_DEFAULTS)}")
    values = {**BATCHING_DEFAULTS, **overrides}
    for key, value in values.items():
        if int(value) < 1:
            raise ValueError(f"batching parameter {key} must be >= 1, got {value}")
    return "".join(f"{key} {{ value: {int(value)} }}\n" for key, value in values.items())


def monitoring_config_text(path: str = PROMETHEUS_PATH) -> str:
    return f'prometheus_config {{\n  enable: true\n  path: "{path}"\n}}\n'


def container_paths(model_name: str, base_path: str, config_dir: str) -> tuple[str, str, list[str]]:
    """Where the official container reads the models and the config folder, and the volumes that
    put them there: a local folder is mounted (``/models/<name>``, ``/config``); a URI of remote
    storage is read as it is (TF Serving reads ``gs://`` and ``s3://`` itself, with the container's
    cloud credentials)."""
    volumes = []
    models, config = base_path, config_dir
    if not storage.is_uri(base_path):
        models = f"/models/{model_name}"
        volumes.append(f"{base_path}:{models}:ro")
    if not storage.is_uri(config_dir):
        config = "/config"
        volumes.append(f"{config_dir}:{config}:ro")
    return models, config, volumes


def server_flags(config: str) -> list[str]:
    """The official server's flags for the config folder ``config`` (as the container sees it)."""
    return [f"--model_config_file={config}/models.config", "--model_config_file_poll_wait_seconds=60",
            "--file_system_poll_wait_seconds=1", "--enable_batching=true",
            f"--batching_parameters_file={config}/batching_parameters.txt", f"--monitoring_config_file={config}/monitoring.config"]  # fmt: skip


def docker_run_script(model_name: str, base_path: str, config_dir: str, grpc_port: int, rest_port: int) -> str:
    _, config, volumes = container_paths(model_name, base_path, config_dir)
    mounts = "".join(f' -v "{volume}"' for volume in volumes)
    flags = " \\\n  ".join(server_flags(config))
    return f"""#!/usr/bin/env bash
# Serve {model_name} with the official TF Serving image (needs Docker; not runnable on the build machine).
set -euo pipefail
exec docker run --rm -p {grpc_port}:8500 -p {rest_port}:8501{mounts} \\
  {TF_SERVING_IMAGE} \\
  {flags}
"""


def docker_compose_text(model_name: str, base_path: str, config_dir: str, grpc_port: int, rest_port: int) -> str:
    _, config, volumes = container_paths(model_name, base_path, config_dir)
    mounts = "".join(f'\n      - "{volume}"' for volume in volumes)
    flags = "".join(f"\n      - {flag}" for flag in server_flags(config))
    return f"""# TF Serving for {model_name}: gRPC on {grpc_port}, REST on {rest_port}, Prometheus at {PROMETHEUS_PATH}.
services:
  tf-serving:
    image: {TF_SERVING_IMAGE}
    ports:
      - "{grpc_port}:8500"
      - "{rest_port}:8501"{"" if not volumes else f"{chr(10)}    volumes:{mounts}"}
    command:{flags}
"""


def write_deployment(base_path: str, model_name: str, output_dir: str, num_versions: int = 2,
                     index_base_dir: str | None = None, grpc_port: int = 8500, rest_port: int = 8501,
                     batching: dict | None = None) -> dict:  # fmt: skip
    """Write the TF Serving artifacts for the versions under ``base_path`` into ``output_dir``:

    * ``models.config`` -- ``ModelServerConfig`` text proto with the base path as the official
      ``tensorflow/serving`` container sees it (``/models/<name>``, or the URI of a base path on
      remote storage, :func:`container_paths`), the version policy below and a
      ``stable`` version label on the newest served version;
    * ``models.local.config`` -- the same with the host path, for ``tfhash serve model`` or a
      ``tensorflow_model_server`` run on this host;
    * ``batching_parameters.txt`` -- ``BatchingParameters`` for ``--enable_batching``;
    * ``monitoring.config`` -- Prometheus metrics at ``/monitoring/prometheus/metrics``;
    * ``docker-compose.yml`` and ``docker-run.sh`` -- the official image with all of the above;
    * ``deployment.json`` -- what was written, the versions found and whether each has its warmup
      records (``assets.extra/tf_serving_warmup_requests``, written by the Trainer).

    Version policy: ``specific { versions: [...] }`` pins the newest ``num_versions`` (default 2)
    versions whose index is published and pairs with them (an index under
    ``<index_base_dir>/<version>/`` whose manifest names the version, whose checksums verify and whose
    fingerprint is the SavedModel's: :func:`tfhash.serving.versions.pair_published`; every version
    when no index folder is given). A push without its index, or a broken push, therefore
    never enters the policy and never makes TF Serving unload the version the search service pairs
    (``latest {num_versions: N}`` would: it follows the newest folders, loadable or not). Regenerate
    the files after publishing a pair (the pipeline does, and ``tfhash serve config``); TF Serving
    re-reads ``models.config`` every ``--model_config_file_poll_wait_seconds`` (60 in the generated
    command) and ``tfhash serve model`` every ``--config-poll-seconds``. The previous pair stays loaded
    until the next publish, so the search service swaps with its in-flight requests answered.

    The tensorflow-serving-api wheel ships ``model_server_config.proto`` but not the batching or
    monitoring protos, so those two files are written as text in the field names of TF Serving's
    ``session_bundle_config.proto`` and ``monitoring_config.proto``.

    Raises:
        ValueError: ``base_path`` holds no complete SavedModel version (with a published index).
    """
    base_path, output_dir = (path if storage.is_uri(path) else os.path.abspath(path) for path in (base_path, output_dir))
    versions = []
    for version in reversed(list_versions(base_path)):  # newest first: older pairs are not verified (nor downloaded)
        if index_base_dir is None or pair_published(index_base_dir, version, model_version_dir(base_path, version)):
            versions.insert(0, version)
        if len(versions) == num_versions:
            break
    if not versions:
        having = f" with a published index under {index_base_dir}" if index_base_dir is not None else ""
        raise ValueError(f"{base_path}: no SavedModel version (a numbered folder with saved_model.pb){having} to serve")
    labels = {"stable": versions[-1]}
    files = {
        "models.config": models_config([model_config(model_name, container_paths(model_name, base_path, output_dir)[0],
                                                     labels=labels, versions=versions)]),  # fmt: skip
        "models.local.config": models_config([model_config(model_name, base_path, labels=labels, versions=versions)]),
    }
    texts = {name: text_format.MessageToString(proto) for name, proto in files.items()}
    texts["batching_parameters.txt"] = batching_parameters_text(**(batching or {}))
    texts["monitoring.config"] = monitoring_config_text()
    texts["docker-compose.yml"] = docker_compose_text(model_name, base_path, output_dir, grpc_port, rest_port)
    texts["docker-run.sh"] = docker_run_script(model_name, base_path, output_dir, grpc_port, rest_port)
    summary = {
        "model_name": model_name,
        "base_path": base_path,
        "version_policy": "specific",
        "versions": versions,
        "version_labels": labels,
        "warmup_records": {str(v): storage.isfile(storage.join(model_version_dir(base_path, v), WARMUP_FILE)) for v in versions},
        "files": sorted([*texts, "deployment.json"]),
        "image": TF_SERVING_IMAGE,
    }
    texts["deployment.json"] = json.dumps(summary, indent=2)
    for name, text in texts.items():  # each file replaced whole: a server polling it never reads half of one
        storage.write_text(storage.join(output_dir, name), text)
        if name == "docker-run.sh" and not storage.is_uri(output_dir):
            os.chmod(storage.join(output_dir, name), 0o755)
    return summary
