"""``tfhash pipeline run|compile``."""

from __future__ import annotations

import json

import click

from tfhash.console import BadInput


@click.group("pipeline")
def pipeline_group() -> None:
    """Run the TFX pipeline locally or compile it for Kubeflow."""


def _load(config_path: str):
    from tfhash.pipelines.config import PipelineConfig

    try:
        return PipelineConfig.load(config_path)
    except ValueError as err:
        raise BadInput(str(err)) from err


@pipeline_group.command("run")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.pass_obj
def run(obj, config_path: str) -> None:
    """Run the pipeline with LocalDagRunner and print the summary (also written to the run dir).
    The ``tfhash`` command's context object may carry ``after_push`` (see
    :func:`tfhash.pipelines.runner.run_local`)."""
    config = _load(config_path)  # a bad config is refused before TFX loads
    from tfhash.pipelines.runner import run_local

    from tfhash.index import IndexUnavailableError

    try:
        summary = run_local(config, log=lambda message: click.echo(f"[tfhash] {message}", err=True),
                            after_push=(obj or {}).get("after_push"))  # fmt: skip
    except ValueError as err:  # bad records under policy "fail", unusable data or settings
        raise BadInput(str(err)) from err
    except IndexUnavailableError as err:  # a Milvus that cannot be reached
        raise click.ClickException(str(err)) from err
    click.echo(json.dumps(summary, indent=2))
    metrics = summary.get("metrics") or {}
    click.echo(
        f"model version {summary.get('model_version')}: mAP@all {metrics.get('mAP@all', float('nan')):.4f}, "
        f"P@H<=2 {metrics.get('P@H<=2', float('nan')):.4f}, blessed {summary.get('blessed')}, "
        f"indexes {', '.join(summary.get('indexes') or {}) or None}"
        + (f" (same distances for the example query: {example['same_distances']})" if (example := summary.get("example_query")) else "")
    )


@pipeline_group.command("compile")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--output", required=True, help="Kubeflow Pipelines v2 JSON to write.")
def compile_(config_path: str, output: str) -> None:
    """Compile the pipeline for Kubeflow Pipelines (KubeflowV2DagRunner)."""
    config = _load(config_path)  # a bad config is refused before TFX loads
    from tfhash.pipelines.runner import compile_kubeflow

    click.echo(compile_kubeflow(config, output))
