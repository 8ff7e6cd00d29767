"""TF Serving deployment artifacts for a model base directory (what the pipeline's Pusher fills).

``write_deployment`` writes, into one folder:

* ``models.config`` -- ``ModelServerConfig`` text proto with the base path as the official
  ``tensorflow/serving`` container sees it (``/models/<name>``), version policy ``latest
  {num_versions: 2}`` (so a search service that pins the previous version keeps it while it
  swaps to the new one) and a ``stable`` version label on the newest version;
* ``models.local.config`` -- the same with the host path, for ``tfhash serve model`` or a
  ``tensorflow_model_server`` run on this host;
* ``batching_parameters.txt`` -- ``BatchingParameters`` for ``--enable_batching``;
* ``monitoring.config`` -- Prometheus metrics at ``/monitoring/prometheus/metrics``;
* ``docker-compose.yml`` and ``docker-run.sh`` -- the official image with all of the above;
* ``deployment.json`` -- what was written, the versions found and whether each has its warmup
  records (``assets.extra/tf_serving_warmup_requests``, written by the Trainer).

The tensorflow-serving-api wheel ships ``model_server_config.proto`` but not the batching or
monitoring protos, so those two files are written as text in the field names of TF Serving's
``session_bundle_config.proto`` and ``monitoring_config.proto``.
"""

from __future__ import annotations

import json
import os

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2
from tfhash.serving.versions import list_versions

TF_SERVING_IMAGE = "tensorflow/serving:2.16.1"
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
PROMETHEUS_PATH = "/monitoring/prometheus/metrics"

#: Server-side batching for encode requests: batches of up to 128 examples, waiting at most 2 ms.
BATCHING_DEFAULTS = {"max_batch_size": 128, "batch_timeout_micros": 2000, "max_enqueued_batches": 64,
                     "num_batch_threads": 2}  # fmt: skip


def model_config(name: str, base_path: str, num_versions: int = 2, labels: dict[str, int] | None = None):
    """One ``ModelConfig`` entry: TensorFlow platform, ``latest {num_versions}``, version labels."""
    if not name or "/" in name:
        raise ValueError(f"invalid model name {name!r}")
    if num_versions < 1:
        raise ValueError(f"num_versions must be >= 1, got {num_versions}")
    config = model_server_config_pb2.ModelConfig(name=name, base_path=base_path, model_platform="tensorflow")
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
        with open(path) as handle:
            parsed = text_format.Parse(handle.read(), model_server_config_pb2.ModelServerConfig())
    except (OSError, text_format.ParseError) as err:
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


def docker_run_script(model_name: str, base_path: str, config_dir: str, grpc_port: int, rest_port: int) -> str:
    return f"""#!/usr/bin/env bash
# Serve {model_name} with the official TF Serving image (needs Docker; not runnable on the build machine).
set -euo pipefail
exec docker run --rm -p {grpc_port}:8500 -p {rest_port}:8501 \\
  -v "{base_path}:/models/{model_name}:ro" -v "{config_dir}:/config:ro" \\
  {TF_SERVING_IMAGE} \\
  --model_config_file=/config/models.config --model_config_file_poll_wait_seconds=60 \\
  --file_system_poll_wait_seconds=1 \\
  --enable_batching=true --batching_parameters_file=/config/batching_parameters.txt \\
  --monitoring_config_file=/config/monitoring.config
"""


def docker_compose_text(model_name: str, base_path: str, config_dir: str, grpc_port: int, rest_port: int) -> str:
    return f"""# TF Serving for {model_name}: gRPC on {grpc_port}, REST on {rest_port}, Prometheus at {PROMETHEUS_PATH}.
services:
  tf-serving:
    image: {TF_SERVING_IMAGE}
    ports:
      - "{grpc_port}:8500"
      - "{rest_port}:8501"
    volumes:
      - "{base_path}:/models/{model_name}:ro"
      - "{config_dir}:/config:ro"
    command:
      - --model_config_file=/config/models.config
      - --model_config_file_poll_wait_seconds=60
      - --file_system_poll_wait_seconds=1
      - --enable_batching=true
      - --batching_parameters_file=/config/batching_parameters.txt
      - --monitoring_config_file=/config/monitoring.config
"""


def write_deployment(base_path: str, model_name: str, output_dir: str, num_versions: int = 2,
                     grpc_port: int = 8500, rest_port: int = 8501, batching: dict | None = None) -> dict:  # fmt: skip
    """Write the TF Serving artifacts for the versions under ``base_path`` (module docstring).

    Raises:
        ValueError: ``base_path`` holds no complete SavedModel version.
    """
    base_path, output_dir = os.path.abspath(base_path), os.path.abspath(output_dir)
    versions = list_versions(base_path)
    if not versions:
        raise ValueError(f"{base_path}: no SavedModel version (a numbered folder with saved_model.pb) to serve")
    labels = {"stable": versions[-1]}
    os.makedirs(output_dir, exist_ok=True)
    files = {
        "models.config": models_config([model_config(model_name, f"/models/{model_name}", num_versions, labels)]),
        "models.local.config": models_config([model_config(model_name, base_path, num_versions, labels)]),
    }
    texts = {name: text_format.MessageToString(proto) for name, proto in files.items()}
    texts["batching_parameters.txt"] = batching_parameters_text(**(batching or {}))
    texts["monitoring.config"] = monitoring_config_text()
    texts["docker-compose.yml"] = docker_compose_text(model_name, base_path, output_dir, grpc_port, rest_port)
    texts["docker-run.sh"] = docker_run_script(model_name, base_path, output_dir, grpc_port, rest_port)
    for name, text in texts.items():
        with open(os.path.join(output_dir, name), "w") as handle:
            handle.write(text)
    os.chmod(os.path.join(output_dir, "docker-run.sh"), 0o755)
    summary = {
        "model_name": model_name,
        "base_path": base_path,
        "versions": versions,
        "version_labels": labels,
        "warmup_records": {str(v): os.path.isfile(os.path.join(base_path, str(v), WARMUP_FILE)) for v in versions},
        "files": sorted([*texts, "deployment.json"]),
        "image": TF_SERVING_IMAGE,
    }
    with open(os.path.join(output_dir, "deployment.json"), "w") as handle:
        json.dump(summary, handle, indent=2)
    return summary
