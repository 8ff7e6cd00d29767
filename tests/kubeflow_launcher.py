"""A compiled Kubeflow Pipelines v2 spec run here as a cluster runs it: each task as its pod would.

A Kubeflow Pipelines (KFP) v2 cluster runs each task of a PipelineSpec in a pod: its driver builds
the task's ``ExecutorInput`` (the task's parameters, its input artifacts as their producers
recorded them, and a URI under the pipeline root for each output), its launcher fills the
placeholders of the container's arguments (``{{$}}``: that ``ExecutorInput`` as JSON), runs the
container's command, then reads the ``ExecutorOutput`` the command wrote to ``outputs.outputFile``
and records each output artifact's URI and metadata for the tasks downstream. :class:`KubeflowRun`
does the same with local processes, in the DAG's order; what runs is the spec's own command (TFX's
container entrypoint) and arguments.

What it does not do: lifecycle hooks (KFP runs none), caching, and importer or resolver tasks (a
task without a container, which KFP's backend refuses, is refused here too).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2 as pb

#: Where a KFP pod's launcher has the executor write its output (``outputs.outputFile``).
OUTPUT_FILE = os.path.join("tmp", "kfp_outputs", "output_metadata.json")


def task_order(spec: pb.PipelineSpec) -> list[str]:
    """The tasks of the root DAG, each after every task it depends on (by name among equals)."""
    tasks = spec.root.dag.tasks
    upstream = {name: set(task.dependent_tasks) | {a.task_output_artifact.producer_task for a in task.inputs.artifacts.values()}
                for name, task in tasks.items()}  # fmt: skip
    order: list[str] = []
    while len(order) < len(tasks):
        ready = sorted(name for name in tasks if name not in order and upstream[name] <= set(order))
        if not ready:
            raise ValueError(f"the tasks {sorted(set(tasks) - set(order))} depend on each other")
        order += ready
    return order


def fill(arguments: list[str], executor_input: pb.ExecutorInput) -> list[str]:
    """The arguments with ``{{$}}`` replaced by the ``ExecutorInput`` JSON, as the launcher does; a
    placeholder this launcher does not fill is an error (outside a JSON argument, where ``{{$``
    can be text)."""
    whole = json_format.MessageToJson(executor_input, indent=None)
    filled = [argument.replace("{{$}}", whole) for argument in arguments]
    left = [a for a in filled if re.search(r"\{\{\$[^}]*\}\}", a) and not a.lstrip().startswith("{")]
    if left:
        raise ValueError(f"placeholders this launcher does not fill: {left}")
    return filled


class KubeflowRun:
    """One run of ``spec`` (a PipelineSpec as a dict, what ``tfhash pipeline compile`` writes as
    YAML) under ``pipeline_root`` (the spec's default when None) with run id ``run_id``; each task's
    process gets ``env`` and a folder of its own under ``workdir`` (its working directory, holding
    its output file and log).

    ``outputs``: ``{task: {output key: RuntimeArtifact}}`` of the tasks run so far.
    """

    def __init__(self, spec: dict, run_id: str, workdir: str, env: dict | None = None, pipeline_root: str | None = None):
        self.spec = json_format.ParseDict(spec, pb.PipelineSpec())
        self.root = (pipeline_root or self.spec.default_pipeline_root).rstrip("/")
        self.run_id, self.workdir, self.env = run_id, workdir, env
        self.executors = json_format.ParseDict(json_format.MessageToDict(self.spec.deployment_spec), pb.PipelineDeploymentConfig()).executors
        self.outputs: dict[str, dict[str, pb.RuntimeArtifact]] = {}
        self.commands: dict[str, list[str]] = {}
        self._recorded = 0

    def run(self) -> dict:
        for name in task_order(self.spec):
            self.run_task(name)
        return self.outputs

    def run_task(self, name: str) -> None:
        task = self.spec.root.dag.tasks[name]
        component = self.spec.components[task.component_ref.name]
        executor = self.executors[component.executor_label]
        if executor.WhichOneof("spec") != "container":
            raise ValueError(f"task {name} runs a {executor.WhichOneof('spec')}, not a container: Kubeflow Pipelines refuses it")
        pod = tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir)
        executor_input = pb.ExecutorInput(inputs=self._inputs(name, task, component), outputs=self._outputs(name, component, pod))
        command = [*executor.container.command, *fill(list(executor.container.args), executor_input)]
        self.commands[name] = command
        with open(os.path.join(pod, "log.txt"), "w") as log:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=pod)
        if done.returncode:
            with open(os.path.join(pod, "log.txt")) as log:
                raise RuntimeError(f"task {name} exited with {done.returncode}; its log ends:\n{log.read()[-6000:]}")
        self._record(name, executor_input.outputs, os.path.join(pod, OUTPUT_FILE))

    def _inputs(self, name: str, task: pb.PipelineTaskSpec, component: pb.ComponentSpec) -> pb.ExecutorInput.Inputs:
        """The driver's inputs: the task's constant parameters (the component's defaults for the
        others), and each input artifact as its producer recorded it, typed as this component
        declares it."""
        inputs = pb.ExecutorInput.Inputs()
        for key, parameter in task.inputs.parameters.items():
            if parameter.runtime_value.WhichOneof("value") != "constant":
                raise ValueError(f"task {name}: parameter {key} is no runtimeValue.constant, which Kubeflow Pipelines reads")
            inputs.parameter_values[key].CopyFrom(parameter.runtime_value.constant)
        for key, definition in component.input_definitions.parameters.items():
            if key not in inputs.parameter_values and definition.HasField("default_value"):
                inputs.parameter_values[key].CopyFrom(definition.default_value)
        for key, source in task.inputs.artifacts.items():
            producer = source.task_output_artifact
            artifact = pb.RuntimeArtifact()
            artifact.CopyFrom(self.outputs[producer.producer_task][producer.output_artifact_key])
            artifact.type.CopyFrom(component.input_definitions.artifacts[key].artifact_type)
            inputs.artifacts[key].artifacts.append(artifact)
        return inputs

    def _outputs(self, name: str, component: pb.ComponentSpec, pod: str) -> pb.ExecutorInput.Outputs:
        """The driver's outputs: ``<pipeline root>/<pipeline>/<run id>/<task>/<key>`` for each
        artifact, and the output file in the pod."""
        outputs = pb.ExecutorInput.Outputs(output_file=os.path.join(pod, OUTPUT_FILE))
        os.makedirs(os.path.dirname(outputs.output_file))
        for key, definition in component.output_definitions.artifacts.items():
            artifact = outputs.artifacts[key].artifacts.add()
            artifact.uri = "/".join([self.root, self.spec.pipeline_info.name, self.run_id, name, key])
            artifact.type.CopyFrom(definition.artifact_type)
        return outputs

    def _record(self, name: str, outputs: pb.ExecutorInput.Outputs, output_file: str) -> None:
        """The launcher's end of a task: each output artifact with the URI and metadata the executor
        wrote in its ``ExecutorOutput`` (a missing file: none), recorded under a name of the store."""
        executor_output = pb.ExecutorOutput()
        if os.path.isfile(output_file):
            with open(output_file) as handle:
                json_format.Parse(handle.read(), executor_output)
        recorded = {}
        for key, artifacts in outputs.artifacts.items():
            (artifact,) = artifacts.artifacts
            written = executor_output.artifacts[key].artifacts[0] if executor_output.artifacts[key].artifacts else None
            if written is not None:
                artifact.uri = written.uri or artifact.uri
                for field, value in written.metadata.fields.items():
                    artifact.metadata.fields[field].CopyFrom(value)
            artifact.metadata.fields["display_name"].string_value = key
            self._recorded += 1
            artifact.name = str(self._recorded)
            recorded[key] = artifact
        self.outputs[name] = recorded
