"""The pipeline compiled for Kubeflow Pipelines: a spec that holds the config's remote locations and
nothing of the compiling machine, read by the kfp SDK."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from tfhash.cli import main

BUCKET_RUN = "gs://tfhash-test-bucket/runs/tiny"
ROOT = Path(__file__).resolve().parents[1]


def write_config(folder, **settings) -> str:
    path = folder / "cluster.json"
    path.write_text(json.dumps({"name": "tiny-mnist", "dataset": "mnist", "limit": 400,
                                "training": {"method": "scdh", "bits": 16, "epochs": 3}, **settings}))  # fmt: skip
    return str(path)


def compile_spec(tmp_path, *options: str, **settings) -> tuple[dict, str]:
    """Compile a config in a working folder of its own; returns the spec and the command's output."""
    config = write_config(tmp_path, **settings)
    output = tmp_path / "out" / "pipeline.json"
    output.parent.mkdir()
    result = CliRunner().invoke(main, ["pipeline", "compile", "--config", config, "--output", str(output), *options])
    assert result.exit_code == 0, result.output
    return json.loads(output.read_text()), result.output


def test_a_spec_for_a_bucket_holds_no_path_of_this_machine(tmp_path, monkeypatch):
    """Compiling reads no data and writes only the spec; every location in it is the bucket's."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TFHASH_CACHE_DIR", str(cache))
    spec, output = compile_spec(tmp_path, "--run-dir", BUCKET_RUN, image="registry.example/tfhash:1")
    text = json.dumps(spec)
    for local in {str(tmp_path), os.getcwd(), os.path.expanduser("~"), os.path.dirname(os.path.dirname(__file__)), "/tmp"}:
        assert local not in text, local
    assert f"{BUCKET_RUN}/pipeline_root" in text and f"{BUCKET_RUN}/data" in text and f"{BUCKET_RUN}/indexes/tiny-mnist" in text
    assert f"{BUCKET_RUN}/serving/tiny-mnist" in text and "registry.example/tfhash:1" in text
    assert sorted(os.listdir(tmp_path)) == ["cluster.json", "out"] and os.listdir(tmp_path / "out") == ["pipeline.json"]
    assert not cache.exists()  # no metadata store, no trunk cache, no local copy
    assert f"tfhash data export mnist --output {BUCKET_RUN}/data --seed 0 --limit 400" in output
    tasks = spec["pipelineSpec"]["root"]["dag"]["tasks"]
    assert "Trainer" in tasks and "IndexBuilder" in tasks


def test_the_options_and_the_file_name_the_same_spec(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    by_option, _ = compile_spec(tmp_path / "a", "--run-dir", BUCKET_RUN, "--data-dir", "gs://tfhash-test-bucket/data/mnist")
    in_file, _ = compile_spec(tmp_path / "b", run_dir=BUCKET_RUN, data_dir="gs://tfhash-test-bucket/data/mnist", dataset=None)
    assert by_option["pipelineSpec"] == in_file["pipelineSpec"]
    assert "gs://tfhash-test-bucket/data/mnist" in json.dumps(by_option)


@pytest.mark.parametrize(("settings", "options", "message"), [
    ({}, (), "run_dir is not set: on a cluster, set it to a URI"),
    ({"run_dir": "runs/tiny"}, (), "run_dir 'runs/tiny' is not a URI: on a cluster the run directory holds the pipeline root"),
    ({"run_dir": "/mnt/runs/tiny"}, (), "run_dir '/mnt/runs/tiny' is not a URI"),
    ({"run_dir": BUCKET_RUN, "data_dir": "exported", "dataset": None}, (), "data_dir 'exported' is relative"),
    ({"run_dir": BUCKET_RUN, "index_kinds": ["BFlat", "Milvus"]}, (), "needs a Milvus server both the pipeline and the search service reach"),
    ({"run_dir": BUCKET_RUN, "data_root": "gs://b/shared"}, (), "data_root 'gs://b/shared' is a URI"),
    ({}, ("--run-dir", "runs/tiny"), "run_dir 'runs/tiny' is not a URI"),
])  # fmt: skip
def test_what_a_pod_cannot_read_is_refused_before_compiling(tmp_path, settings, options, message):
    config = write_config(tmp_path, **settings)
    output = tmp_path / "pipeline.json"
    result = CliRunner().invoke(main, ["pipeline", "compile", "--config", config, "--output", str(output), *options])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not output.exists()


def test_an_absolute_data_path_is_a_volume_the_pods_mount(tmp_path):
    spec, _ = compile_spec(tmp_path, run_dir=BUCKET_RUN, data_dir="/mnt/tfhash/data/mnist", dataset=None)
    assert "/mnt/tfhash/data/mnist" in json.dumps(spec)


def test_the_yaml_spec_is_what_kfp_client_submits_and_the_json_what_vertex_runs(tmp_path):
    """``.yaml``: the bare PipelineSpec that ``kfp.Client().create_run_from_pipeline_package`` reads
    (parsed here as the client parses it, strictly, and loaded as a component by the public API);
    ``.json``: Vertex AI's PipelineJob. Schema 2.1 (the only one the Kubeflow Pipelines backend
    reads: parameters as ``runtimeValue.constant``), the run's pipeline root as the default, only
    container tasks (no resolver, which only Vertex AI runs) and an uncached ExampleGen."""
    import yaml
    from google.protobuf import json_format
    from kfp import components
    from kfp.client.client import _extract_pipeline_yaml
    from kfp.pipeline_spec import pipeline_spec_pb2

    config = write_config(tmp_path, run_dir=BUCKET_RUN)
    for name in ("pipeline.yaml", "pipeline.json"):
        result = CliRunner().invoke(main, ["pipeline", "compile", "--config", config, "--output", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    spec = _extract_pipeline_yaml(str(tmp_path / "pipeline.yaml")).pipeline_spec
    assert spec.pipeline_info.name == "tiny-mnist" and spec.schema_version == "2.1.0"
    assert spec.default_pipeline_root == f"{BUCKET_RUN}/pipeline_root"
    assert components.load_component_from_file(str(tmp_path / "pipeline.yaml")).name == "tiny-mnist"
    tasks = spec.root.dag.tasks
    assert sorted(tasks) == sorted(["ImportExampleGen", "RecordFilter", "StatisticsGen", "SchemaGen", "Transform", "Trainer",
                                    "RetrievalEvaluator", "Pusher", "IndexBuilder"])  # fmt: skip
    executors = spec.deployment_spec["executors"]
    for name, task in tasks.items():
        executor = executors[spec.components[task.component_ref.name].executor_label]
        assert "container" in executor, name  # what a pod runs; nothing only Vertex AI runs
        for parameter in task.inputs.parameters.values():
            assert parameter.runtime_value.HasField("constant"), name
    assert not tasks["ImportExampleGen"].caching_options.enable_cache and tasks["Trainer"].caching_options.enable_cache
    job = json_format.ParseDict(json.loads((tmp_path / "pipeline.json").read_text()), pipeline_spec_pb2.PipelineJob())
    assert job.pipeline_spec["defaultPipelineRoot"] == f"{BUCKET_RUN}/pipeline_root"
    assert yaml.safe_load((tmp_path / "pipeline.yaml").read_text()) == json.loads((tmp_path / "pipeline.json").read_text())["pipelineSpec"]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """``(instruction, arguments)`` of pipelines/Dockerfile, comments left out."""
    text = (ROOT / "pipelines" / "Dockerfile").read_text()
    lines = [line for line in text.replace("\\\n", " ").splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [tuple(line.split(None, 1)) for line in lines]


def test_the_image_installs_every_extra_a_pod_uses_and_is_the_one_the_spec_names(tmp_path):
    """What can be checked without a Docker engine: the Python the image has is the one the package
    needs; it installs every extra but dev, with the tested versions; it is tagged with the image a
    compiled spec names by default, and every task of a spec runs the config's image."""
    import tomli
    from tfhash.pipelines.config import PipelineConfig

    project = tomli.loads((ROOT / "pyproject.toml").read_text())
    instructions = dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.10-slim") and ">=3.10,<3.11" == project["project"]["requires-python"]
    (install,) = [arguments for name, arguments in instructions if name == "RUN" and "pip install" in arguments]
    extras = set(install.split('".[', 1)[1].split(']"', 1)[0].split(","))
    runtime = set(project["project"]["optional-dependencies"]) - {"all", "dev"}
    assert extras == runtime and "-c constraints/py310.txt" in install
    assert f"docker build -f pipelines/Dockerfile -t {PipelineConfig.__dataclass_fields__['image'].default} ." in \
        (ROOT / "pipelines" / "Dockerfile").read_text()  # fmt: skip
    spec, _ = compile_spec(tmp_path, "--run-dir", BUCKET_RUN, "--image", "registry.example/team/tfhash:1.2")
    images = {executor["container"]["image"] for executor in spec["pipelineSpec"]["deploymentSpec"]["executors"].values()}
    assert images == {"registry.example/team/tfhash:1.2"}


@pytest.mark.process
def test_the_files_the_image_copies_build_the_package(tmp_path):
    """The build context as the Dockerfile's COPY lines make it (without what .dockerignore leaves
    out) builds the wheel, the search service's generated gRPC modules in it."""
    import fnmatch
    import shutil
    import subprocess
    import sys
    import zipfile

    ignored = [line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]  # fmt: skip
    assert ".venv" in ignored and "runs" in ignored

    def left_out(relative: str) -> bool:
        return any(fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(relative, f"{pattern}/*")
                   or any(fnmatch.fnmatch(part, pattern.removeprefix("**/")) for part in relative.split("/")) for pattern in ignored)  # fmt: skip

    image = tmp_path / "opt-tfhash"
    image.mkdir()
    for name, arguments in dockerfile_instructions():
        if name != "COPY":
            continue
        *sources, target = arguments.split()
        for source in sources:
            assert (ROOT / source).exists(), source
            destination = image / (source if target.endswith("/") or len(sources) > 1 else target)
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, destination, ignore=lambda folder, names: [
                    n for n in names if left_out(os.path.relpath(os.path.join(folder, n), ROOT))])  # fmt: skip
            else:
                shutil.copy(ROOT / source, destination)
    assert not (image / "serving" / "search_pb2.py").exists()  # generated by the build, not copied
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheel"),
                    str(image)], check=True, capture_output=True)  # fmt: skip
    (wheel,) = (tmp_path / "wheel").glob("tfhash-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"tfhash/serving/search_pb2_grpc.py", "tfhash/artifact_types.py", "tfhash/pipelines/configs/mnist.json"} <= names


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md", "docs/kubeflow.md"])
def test_the_documented_compile_commands_compile(page, tmp_path):
    """Each page's `tfhash pipeline compile` line, its placeholders filled, compiles the shipped
    config it names (run from the project root, as the pages say)."""
    import shlex

    text = (ROOT / page).read_text().replace("\\\n", " ")
    lines = [line.split("#", 1)[0] for line in text.splitlines() if line.strip().startswith("tfhash pipeline compile")]
    assert lines, page
    for line in lines:
        filled = line.replace("BUCKET", "tfhash-docs").replace("MILVUS", "milvus.search").replace("REGISTRY/PROJECT", "registry.example/team")
        args = shlex.split(filled)[1:]
        args[args.index("--output") + 1] = str(tmp_path / os.path.basename(args[args.index("--output") + 1]))
        args[args.index("--config") + 1] = str(ROOT / args[args.index("--config") + 1])
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (page, line, result.output)
