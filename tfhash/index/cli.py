"""``tfhash index build|search|info|verify``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click
import numpy as np

from tfhash.console import BadInput
from tfhash.index.base import IndexUnavailableError
from tfhash.index.factory import index_type_names
from tfhash.index.refine import DEFAULT_K_FACTOR

__all__ = ["index_group"]


def _load_array(path: str, name: str) -> np.ndarray:
    try:
        with np.load(path, allow_pickle=False) as content:
            if name not in content.files:
                raise BadInput(f"{path} has no array {name!r}; it has {content.files}")
            return content[name]
    except (OSError, ValueError) as err:
        raise BadInput(f"{path}: not a readable .npz file ({err})") from err


@contextmanager
def _reported() -> Iterator[None]:
    """The index library's errors as the command's failure (:mod:`tfhash.console`): a refused
    input (HashIndexError, IndexFormatError: ValueErrors) exits with 2; a missing back-end
    (ImportError) or a store that cannot be reached (IndexUnavailableError) with 1."""
    try:
        yield
    except ValueError as err:
        raise BadInput(str(err)) from err
    except (ImportError, IndexUnavailableError) as err:
        raise click.ClickException(str(err)) from err


@click.group("index")
def index_group() -> None:
    """Build, query and inspect retrieval indexes."""


@index_group.command("build")
@click.argument("codes_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--array", "array_name", default="db_codes", show_default=True, help="Array of codes in the .npz.")
@click.option("--ids-array", default=None, help="Array of int64 ids in the .npz (default: 0..n-1).")
@click.option("--index-type", "--kind", "index_type", default="BFlat", show_default=True,
              help=f"Index type: {index_type_names()}.")
@click.option("--bits", type=int, default=None, help="Code length (default: from the codes).")
@click.option("--output", required=True, help="Index directory to write: a folder or a URI (gs://bucket/indexes/3/BFlat).")
@click.option("--model-version", default=None, help="SavedModel version the codes came from (recorded).")
@click.option("--signature-fingerprint", default=None, help="Fingerprint of the encoding signature (recorded).")
@click.option("--batch-size", default=100_000, show_default=True, type=click.IntRange(1))
@click.option("--uri", default=None, help="Milvus index: a Milvus Lite file or a server URI (token: $TFHASH_MILVUS_TOKEN).")
@click.option("--collection", default=None, help="Milvus index: the collection to create.")
@click.option("--embeddings-array", default=None,
              help="Array of the items' continuous codes in the .npz, stored for the second stage of a search (docs/indexes.md).")
def build(codes_file, array_name, ids_array, index_type, bits, output, model_version, signature_fingerprint, batch_size,
          uri, collection, embeddings_array) -> None:  # fmt: skip
    """Build an index from codes in an .npz file (+-1 or packed uint8)."""
    from tqdm import tqdm

    from tfhash.index import TRAIN, Embeddings, index_factory

    codes = _load_array(codes_file, array_name)
    ids = _load_array(codes_file, ids_array) if ids_array else np.arange(codes.shape[0])
    continuous = _load_array(codes_file, embeddings_array) if embeddings_array else None
    if bits is None:
        bits = codes.shape[1] * 8 if codes.dtype == np.uint8 else codes.shape[1]
    where = {key: value for key, value in (("uri", uri), ("collection", collection)) if value is not None}
    with _reported():
        index = index_factory(bits, index_type, **where)
        if index.supports(TRAIN):
            index.train(codes[: max(batch_size, 100_000)])
        for start in tqdm(range(0, codes.shape[0], batch_size), desc="adding", unit="batch", file=sys.stderr):
            index.add(codes[start : start + batch_size], ids[start : start + batch_size])
        embeddings = None if continuous is None else Embeddings.of(continuous, ids)
        index.save(output, model_version=model_version, signature_fingerprint=signature_fingerprint, embeddings=embeddings)
    click.echo(json.dumps(index.describe(), indent=2))
    index.close()


@index_group.command("search")
@click.argument("index_dir")
@click.option("--queries", "queries_file", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--array", "array_name", default="query_codes", show_default=True)
@click.option("-k", "k", default=10, show_default=True, type=int)
@click.option("--expected-model-version", default=None, help="Refuse an index built for another model version.")
@click.option("--expected-signature-fingerprint", default=None,
              help="Refuse an index built by another SavedModel (its fingerprint: tfhash.artifacts.signature_fingerprint).")
@click.option("--embeddings-array", default=None,
              help="Array of the queries' continuous codes in the .npz: order the Hamming candidates by the index's stored "
                   "embeddings (the second stage; --array is then not read).")  # fmt: skip
@click.option("--k-factor", default=DEFAULT_K_FACTOR, show_default=True, type=click.IntRange(1),
              help="Second stage: Hamming candidates per neighbour asked for.")
def search(index_dir, queries_file, array_name, k, expected_model_version, expected_signature_fingerprint, embeddings_array,
           k_factor) -> None:  # fmt: skip
    """k nearest ids and distances for each query (JSON lines on stdout); INDEX_DIR: a folder or a URI."""
    from tfhash.index import HashIndexError, load_embeddings, load_index, refined_search

    with _reported():
        index = load_index(index_dir, expected_model_version=expected_model_version,
                           expected_signature_fingerprint=expected_signature_fingerprint)  # fmt: skip
        try:
            if embeddings_array is None:
                result = index.search(_load_array(queries_file, array_name), k)
            else:
                stored = load_embeddings(index_dir)
                if stored is None:
                    raise HashIndexError(f"{index_dir} stores no embeddings; build it with --embeddings-array, or search "
                                         "without --embeddings-array (Hamming order)")  # fmt: skip
                result = refined_search(index, stored, _load_array(queries_file, embeddings_array), k, k_factor)
        finally:
            index.close()
    for row_ids, row_distances in zip(result.ids, result.distances, strict=True):
        click.echo(json.dumps({"ids": row_ids.tolist(), "distances": row_distances.tolist()}))


@index_group.command("info")
@click.argument("index_dir")
def info(index_dir) -> None:
    """Print the index manifest after verifying the checksums; INDEX_DIR: a folder or a URI."""
    from tfhash.index import read_manifest, verify_files

    with _reported():
        manifest = read_manifest(index_dir)
        verify_files(index_dir, manifest)
    click.echo(json.dumps(manifest, indent=2))


@index_group.command("verify")
@click.argument("path")
@click.option("--model-dir", default=None,
              help="A SavedModel version folder (<model base>/<version>): each index must be locked to it, its version and "
                   "signature fingerprint.")  # fmt: skip
def verify(path, model_dir) -> None:
    """Verify an index directory, or every index of a version directory (<index base>/<version>/):
    its manifest and every file's checksum (the codes, ids and embeddings), and with --model-dir its
    lock to that model, whose variables must read back whole (their checksums). One JSON line per index; exits 2 when any fails. PATH: a folder or a URI."""
    import os

    from tfhash import storage
    from tfhash.artifacts import verify_saved_model
    from tfhash.index import read_manifest, verify_files
    from tfhash.index.persistence import MANIFEST, check_model
    from tfhash.index.refine import MANIFEST_FIELD

    if not storage.isdir(path):
        raise BadInput(f"{path}: no such directory; pass an index directory or a version directory of indexes")
    folders = [path] if storage.isfile(storage.join(path, MANIFEST)) else \
        [storage.join(path, name) for name in sorted(storage.listdir(path)) if storage.isdir(storage.join(path, name))]  # fmt: skip
    if not folders:
        raise BadInput(f"{path}: neither an index ({MANIFEST}) nor a folder of indexes")
    with _reported():
        expected = (None, None) if model_dir is None else (os.path.basename(model_dir.rstrip("/")), verify_saved_model(model_dir))
    failed = 0
    for folder in folders:
        try:
            manifest = read_manifest(folder)
            verify_files(folder, manifest)
            check_model(folder, manifest, *expected)
        except ValueError as err:  # IndexFormatError: named with its reason
            failed += 1
            click.echo(json.dumps({"index": folder, "ok": False, "error": str(err)}))
            continue
        click.echo(json.dumps({"index": folder, "ok": True, "kind": manifest["kind"], "count": manifest["count"],
                               "model_version": manifest["model"].get("version"), "embeddings": MANIFEST_FIELD in manifest}))  # fmt: skip
    if failed:
        raise BadInput(f"{failed} of {len(folders)} indexes under {path} failed verification (the lines above say why)")
