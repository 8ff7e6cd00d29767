"""The ``tfhash`` command line."""

from __future__ import annotations

import json

import click

from tfhash._version import __version__
from tfhash.codes import check_bits
from tfhash.console import BadInput, setup_console

__all__ = ["main", "write_serving_config"]


# Nothing above imports TensorFlow: ``main`` sets the console (TF_CPP_MIN_LOG_LEVEL among it) before
# a command imports it, and the commands import their heavy modules inside their bodies.


def write_serving_config(layout) -> dict:
    """After a pipeline run that pushed a model version: TF Serving's models.config and the
    deployment examples for the run's serving and index folders (:mod:`tfhash.serving.deployment`)."""
    from tfhash.serving.deployment import write_deployment

    write_deployment(layout.serving, layout.name, layout.tf_serving, index_base_dir=layout.indexes)
    return {"tf_serving_config": layout.tf_serving}


# The command line joins the stages: a pipeline run is followed by the serving side's config.
@click.group(context_settings={"help_option_names": ["-h", "--help"], "obj": {"after_push": write_serving_config}})
@click.version_option(__version__, prog_name="tfhash")
@click.option("-v", "--verbose", count=True,
              help="Show the full log: TensorFlow, TFX and library warnings (-v info, -vv debug).")
def main(verbose: int) -> None:
    """tfhash: deep hashing for TensorFlow / Keras."""
    setup_console(verbose)


def _code_length(ctx: click.Context, param: click.Parameter, bits: int) -> int:
    """click callback of ``--bits``: refuse a length that packed codes cannot hold while the options
    are parsed, before any data or TensorFlow loads, with the message of
    :func:`tfhash.codes.check_bits` (the one statement of which lengths exist)."""
    try:
        return check_bits(bits)
    except ValueError as err:
        raise click.BadParameter(str(err), ctx, param) from err


@main.command()
@click.option("--bits", default=48, show_default=True, type=click.IntRange(max=256), callback=_code_length,
              help="Code length K: a multiple of 8.")
@click.option("--epochs", default=20, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--data-root", default=None, help="Folder holding mnist/ (default: $TFHASH_DATA_ROOT or ../shared/data).")
@click.option("--output-dir", default="runs/quickstart", show_default=True)
def quickstart(bits: int, epochs: int, seed: int, data_root: str | None, output_dir: str) -> None:
    """Train SCDH on MNIST (standard protocol), encode, search and print mAP."""
    from tfhash.data import DataFormatError, DataNotFoundError
    from tfhash.quickstart import run_quickstart

    click.echo(f"tfhash quickstart: SCDH, {bits} bits, {epochs} epochs, seed {seed} (MNIST, 5,000 train / "
               "1,000 queries / 69,000 database)")  # fmt: skip
    try:
        summary = run_quickstart(bits=bits, epochs=epochs, seed=seed, data_root=data_root, output_dir=output_dir, verbose=2)
    except (DataNotFoundError, DataFormatError) as err:
        raise BadInput(str(err)) from err
    example = summary["example_query"]
    click.echo(f"training: {summary['train_seconds']} s; encoding 70,000 images: {summary['encode_seconds']} s")
    click.echo(f"example query (class {example['query_label']}): nearest classes {example['nearest_labels']} "
               f"at Hamming distances {example['nearest_distances']}")  # fmt: skip
    click.echo(f"P@H<=2: {summary['P@H<=2']:.4f}   P@1000: {summary['P@1000']:.4f}")
    click.echo(f"summary written to {summary['output_dir']}/summary.json")
    click.echo(f"model written to {summary['model_path']} (keras.saving.load_model after import tfhash.models)")
    click.echo(f"mAP@all: {summary['mAP@all']:.4f}")


@main.command()
@click.argument("codes_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--output-dir", required=True, help="Where metrics.json and the PNG plots go.")
@click.option("--top-r", default=None, type=click.IntRange(1), help="Depth R of mAP@R (default: whole database).")
@click.option("--radius", default=2, show_default=True, type=click.IntRange(0))
@click.option("--tsne/--no-tsne", default=True, show_default=True)
@click.option("--seed", default=0, show_default=True, type=int)
def evaluate(codes_file: str, output_dir: str, top_r: int | None, radius: int, tsne: bool, seed: int) -> None:
    """metrics.json and PNG plots from an .npz of codes and labels.

    CODES_FILE holds these arrays (numpy.savez), m queries and n database items:

    \b
      query_codes   (m, K) +-1 codes, or (m, K/8) packed uint8
      db_codes      (n, K) +-1 codes, or (n, K/8) packed uint8
      query_labels  (m,) integer class ids, or (m, C) one-hot / multi-hot
      db_labels     (n,) integer class ids, or (n, C) one-hot / multi-hot

    K is a multiple of 8. +-1 codes may have any numeric dtype but uint8 (tfhash writes int8); a
    uint8 array is read as packed codes, numpy.packbits of the bits (+1 -> 1). Other arrays are
    ignored: the bits of quickstart's codes.npz, for one (the length comes from the codes).
    """
    from tfhash.evaluation_report import write_evaluation

    try:
        metrics = write_evaluation(codes_file, output_dir, top_r=top_r, radius=radius, tsne=tsne, seed=seed)
    except (ValueError, TypeError) as err:
        raise BadInput(str(err)) from err
    click.echo(json.dumps(metrics, indent=2))


@main.group()
def data() -> None:
    """The shipped datasets and your own: export, query images."""


@data.command("info")
@click.argument("name", type=click.Choice(["mnist", "cifar10", "mirflickr25k", "wiki"]))
@click.option("--data-root", default=None)
@click.option("--seed", default=0, show_default=True, type=int)
def data_info(name: str, data_root: str | None, seed: int) -> None:
    """Load a dataset and print its shapes and standard split."""
    from tfhash.data import DataFormatError, DataNotFoundError, load_dataset

    try:
        dataset = load_dataset(name, data_root=data_root, seed=seed)
    except (DataNotFoundError, DataFormatError) as err:
        raise BadInput(str(err)) from err
    click.echo(json.dumps(dataset.describe(), indent=2))


@data.command("export")
@click.argument("name", type=click.Choice(["mnist", "cifar10", "mirflickr25k", "wiki"]))
@click.option("--output", required=True, help="Folder or URI (gs://bucket/data/mnist) for train/, query/, database/.")
@click.option("--data-root", default=None)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the standard split.")
@click.option("--shards", default=1, show_default=True, type=click.IntRange(1))
@click.option("--limit", default=None, type=click.IntRange(1), help="Keep the first N examples of each split.")
def data_export(name: str, output: str, data_root: str | None, seed: int, shards: int, limit: int | None) -> None:
    """Write a dataset's standard split as gzipped TFRecord tf.Examples (ImportExampleGen input)."""
    from tfhash import storage
    from tfhash.data import DataFormatError, DataNotFoundError, load_dataset
    from tfhash.data.export import export_tfrecords

    try:
        storage.check_scheme(output)
        metadata = export_tfrecords(load_dataset(name, data_root=data_root, seed=seed), output, shards, limit)
    except (DataNotFoundError, DataFormatError, ValueError) as err:
        raise BadInput(str(err)) from err
    click.echo(json.dumps(metadata, indent=2))


def _modalities(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> dict[str, str]:
    """click callback of ``--features``: the NAME=PATH items as {modality: path}, an item of
    another form refused while the options are parsed."""
    modalities = {}
    for item in items:
        modality, sep, path = item.partition("=")
        if not sep or not modality or not path:
            raise click.BadParameter(f"takes NAME=PATH, got {item!r}", ctx, param)
        modalities[modality] = path
    return modalities


@data.command("export-user")
@click.option("--output", required=True, help="Folder or URI (gs://bucket/data/photos) for train/, query/, database/.")
@click.option("--images", type=click.Path(exists=True),
              help="A folder of class sub-folders of images (<folder>/<class>/<image>), or a .csv list of image files "
                   "and their class names (path,labels; ';' between several).")
@click.option("--image-size", nargs=2, type=click.IntRange(1), default=None,
              help="Resize every image to HEIGHT WIDTH (needed when the images differ in size).")
@click.option("--skip-bad", is_flag=True, help="Leave out unreadable image files (recorded in metadata.json) instead of failing.")
@click.option("--features", "features", multiple=True, metavar="NAME=PATH", callback=_modalities,
              help="A modality's feature matrix (.npy or .csv, one row per example); twice for paired cross-modal data.")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False),
              help="With --features: class ids or class names (one column; ';' between several), or multi-hot rows.")
@click.option("--queries", default=None, type=click.IntRange(1),
              help="Query items [default: 100, or a tenth of a small folder].")
@click.option("--train", default=None, type=click.IntRange(1),
              help="Training items, from the database [default: 1000, or the rest of a small folder].")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random split.")
@click.option("--name", default="custom", show_default=True)
@click.option("--shards", default=1, show_default=True, type=click.IntRange(1))
def data_export_user(output, images, image_size, skip_bad, features, labels, queries, train, seed, name, shards) -> None:
    """Write your own data (image folders, or .npy/.csv features with labels) as pipeline input,
    with metadata.json (what was converted, resized or skipped) and items.csv (each id's file and
    classes)."""
    from tfhash import storage
    from tfhash.data import DataFormatError
    from tfhash.data.export import export_tfrecords
    from tfhash.data.user import load_user_dataset

    try:
        storage.check_scheme(output)
        dataset = load_user_dataset(features or None, labels, images, tuple(image_size) if image_size else None,
                                    queries, train, seed, name, skip_bad)  # fmt: skip
        metadata = export_tfrecords(dataset, output, shards)
    except (DataFormatError, ValueError) as err:
        raise BadInput(str(err)) from err
    click.echo(json.dumps(metadata, indent=2))


@data.command("image-query")
@click.argument("image", type=click.Path(exists=True, dir_okay=False))
@click.option("--data-dir", required=True,
              help="The folder or URI export-user wrote (its metadata.json: the images' size and colour).")
def data_image_query(image: str, data_dir: str) -> None:
    """Print IMAGE as a base64 serialized tf.Example, prepared as export-user prepared the images:
    the "examples" entry of a REST search body."""
    import base64

    from tfhash.data import DataFormatError
    from tfhash.data.user import image_query

    try:
        click.echo(base64.b64encode(image_query(image, data_dir)).decode("ascii"))
    except DataFormatError as err:
        raise BadInput(str(err)) from err


def _training_section(path: str, bits: int):
    """The :class:`tfhash.training_spec.TrainingSpec` of a JSON file holding a pipeline config or
    its training section alone, at ``bits``, parsed as the pipeline parses it (a named ``recipe``
    laid under it, at ``bits``: the recipe for photos differs by code length)."""
    from tfhash.recipes import with_recipe
    from tfhash.training_spec import TrainingSpec

    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a JSON file of training settings ({err}); write a pipeline config or its "
                         "training section") from err  # fmt: skip
    section = raw.get("training", raw) if isinstance(raw, dict) else raw
    if isinstance(section, dict):
        section = with_recipe({**section, "bits": bits})
    return TrainingSpec.from_dict(section, where=f"{path}: training.")


@main.command()
@click.argument("data_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--bits", default=32, show_default=True, type=click.IntRange(max=256), callback=_code_length,
              help="Code length K: a multiple of 8.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seeds the validation split, the search and the trials.")
@click.option("--kind", default=None, type=click.Choice(["single-label", "single-label pixels", "multi-label", "cross-modal", "single-label photos"]),
              help="The kind of data (tfhash.recipes.DATA_KINDS, or photos; default: from the arrays).")
@click.option("--max-units", default=None, type=click.IntRange(3),
              help="Hyperband's top fidelity (a trial of u units trains u / max-units of its recipe's epochs; factor 3); "
                   "default 9, for photos 3 (tfhash.tuning.photos.PHOTO_BUDGET).")
@click.option("--trials", default=None, type=click.IntRange(1), help="Start no trial after this many.")
@click.option("--seconds", default=None, type=click.FloatRange(min=0, min_open=True), help="Start no trial after this wall time.")
@click.option("--base", "base_file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Photos: a JSON file holding the training section to search above (a pipeline config, or its "
                   "training section alone), instead of tfhash.recipes.recommended_photos; --bits and --seed replace its own.")
@click.option("--output-dir", required=True, help="Where tuning.json (recipe, trials, cost) and trials.md go.")
def tune(data_file: str, bits: int, seed: int, kind: str | None, max_units: int, trials: int | None, seconds: float | None,
         base_file: str | None, output_dir: str) -> None:  # fmt: skip
    """Choose the method and recipe for your features on a validation split of their rows.

    DATA_FILE is an .npz (numpy.savez) holding:

    \b
      x            (n, d) feature vectors; or x_<modality> for each of two modalities; or
                   (n, H, W[, 3]) photos, uint8 (their recipe searched above the trunk cache
                   of tfhash.recipes.recommended_photos at --bits, or of --base: tfhash.tuning.PhotoSpace)
      labels       (n,) integer class ids, or (n, C) one-hot / multi-hot
      unlabelled   optional (m, d) rows without labels (the semi-supervised MT-SCDH variants
                   join the search, the only ones that train on them)

    The chosen recipe is printed and written with every trial to OUTPUT_DIR/tuning.json; train it
    on all rows with tfhash.recipes.Recipe(**recipe).fit(x, labels, bits) (photos:
    tfhash.tuning.photos.fit_photos(tfhash.training_spec.TrainingSpec.from_dict(recipe), x, labels)), and when tuning.json
    says "unlabelled": true with the unlabelled rows appended to x, their labels id -1 (or all-zero
    multi-hot rows), as tfhash.tuning.TuneResult.fit does.
    """
    import os

    import numpy as np

    from tfhash.tuning import Budget
    from tfhash.tuning import tune as run_tune
    from tfhash.tuning.photos import PHOTO_BUDGET
    from tfhash.tuning.search import are_photos

    try:
        with np.load(data_file, allow_pickle=False) as arrays:
            names = set(arrays.files)
            paired = {name[2:]: arrays[name] for name in sorted(names) if name.startswith("x_")}
            if "labels" not in names or not ("x" in names or len(paired) == 2):
                raise ValueError(f"{data_file} holds {sorted(names)}; it needs 'labels' and 'x' (or two x_<modality> arrays)")
            x = arrays["x"] if "x" in names else paired
            unlabelled = arrays["unlabelled"] if "unlabelled" in names else None
            labels = arrays["labels"]
        photos = are_photos(x, kind)
        max_units = max_units or (PHOTO_BUDGET.max_units if photos else Budget().max_units)
        base = None if base_file is None else _training_section(base_file, bits)
        result = run_tune(x, labels, bits, seed=seed, budget=Budget(max_units=max_units, trials=trials, seconds=seconds),
                          kind=kind, unlabelled=unlabelled, base=base)  # fmt: skip
    except ValueError as err:
        raise BadInput(str(err)) from err
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "tuning.json"), "w") as f:
        json.dump(result.summary(), f, indent=2, default=float)
    with open(os.path.join(output_dir, "trials.md"), "w") as f:
        f.write(result.table() + "\n")
    click.echo(result.table())
    click.echo(f"{len(result.trials)} trials in {result.seconds} s (budget: {result.budget.multiple():.1f} trainings)")
    chosen = f"on {result.recipe.backbone}, {result.recipe.epochs} epochs" if photos else json.dumps(result.recipe.options)
    click.echo(f"chosen: {result.recipe.method} {chosen}, validation mAP@all {result.score:.4f}"
               + (", trained with the unlabelled rows too: pass them when you train it" if result.unlabelled else ""))
    click.echo(f"written to {output_dir}/tuning.json")


@main.command("methods")
def methods_() -> None:
    """The registered methods (tfhash.registry): name, label and what each needs."""
    from tfhash.registry import get_method, method_names

    flags = ("cross_modal", "needs_tag_statistics", "label_coefficients", "semi_supervised", "in_pipeline")
    for name in method_names():
        method = get_method(name)
        click.echo(f"{name:10s} {method.label:22s} " + " ".join(flag for flag in flags if getattr(method, flag)))


def _register_subgroups() -> None:
    from tfhash.index.cli import index_group
    from tfhash.pipelines.cli import pipeline_group
    from tfhash.serving.cli import serve_group

    main.add_command(index_group)
    main.add_command(pipeline_group)
    main.add_command(serve_group)


_register_subgroups()


if __name__ == "__main__":
    main()
