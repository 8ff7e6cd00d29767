"""``tfhash pipeline run|compile``."""

from __future__ import annotations

import json

import click

from tfhash import storage
from tfhash.console import BadInput

__all__ = ["pipeline_group"]


@click.group("pipeline")
def pipeline_group() -> None:
    """Run the TFX pipeline locally or compile it for Kubeflow."""


def _load(config_path: str, **options):
    from tfhash.pipelines.config import PipelineConfig

    try:
        return PipelineConfig.load(config_path, **options)
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
@click.option("--run-dir", default=None, help="The run directory on the cluster's storage (e.g. gs://my-bucket/runs/mnist), "
              "over the config's run_dir.")
@click.option("--data-dir", default=None, help="Exported data on the cluster's storage, over the config's data_dir.")
@click.option("--image", default=None, help="The container image the pods run, over the config's image.")
@click.option("--milvus-uri", default=None, help="The Milvus server of a Milvus index (e.g. http://milvus.search:19530), over "
              "the config's milvus_uri.")
def compile_(config_path: str, output: str, run_dir: str | None, data_dir: str | None, image: str | None,
             milvus_uri: str | None) -> None:  # fmt: skip
    """Compile the pipeline for Kubeflow Pipelines (KubeflowV2DagRunner). Nothing is read or
    exported: every location must be a URI the pods reach (gs://, s3://) or an absolute path of a
    volume they mount, and the data must be exported there before the run (docs/kubeflow.md)."""
    overrides = {key: value for key, value in (("run_dir", run_dir), ("data_dir", data_dir), ("image", image),
                                               ("milvus_uri", milvus_uri)) if value}  # fmt: skip
    if data_dir:
        overrides["dataset"] = None  # data_dir replaces the shipped dataset
    config = _load(config_path, for_cluster=True, overrides=overrides)  # a bad config is refused before TFX loads
    from tfhash.pipelines.runner import compile_kubeflow

    click.echo(compile_kubeflow(config, output))
    where = config.layout
    how = "" if config.data_dir else (f": tfhash data export {config.dataset} --output {where.data} --seed {config.split_seed}"
                                      + (f" --limit {config.limit}" if config.limit else ""))  # fmt: skip
    click.echo(f"[tfhash] the pods read the exported data at {where.data}{how or ' (export it there first)'}; the run "
               f"writes under {config.run_dir}; image {config.image}", err=True)
    schemes = {location.split("://", 1)[0] for location in (config.run_dir, config.data_dir) if storage.is_uri(location)} - {"gs"}
    if schemes:
        click.echo(f"[tfhash] {', '.join(sorted(schemes))}:// needs what pipelines/Dockerfile does not install: "
                   f"{'; '.join(storage.SCHEME_PACKAGES.get(s, 'the package that registers it') for s in sorted(schemes))}",
                   err=True)  # fmt: skip
