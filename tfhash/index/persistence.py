"""Index directories: data files plus ``manifest.json``, written atomically, verified on load.

This module knows no index class: it writes any index (:func:`save_index`) and reads one with the
reader it is given (:func:`open_index`). The table from format tags to classes lives in
:mod:`tfhash.index.factory`, whose ``read_manifest`` and ``load_index`` are the public entry points
for reading.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path

from tfhash import storage
from tfhash._version import __version__

__all__ = ["FORMAT_VERSION", "FORMAT_TAG_FIELD", "IndexFormatError", "save_index", "parse_manifest", "on_local_copy", "verify_files", "check_model", "open_index"]


FORMAT_VERSION = 1
MANIFEST = "manifest.json"
#: The manifest field that holds the format tag (named ``kind`` since format version 1).
FORMAT_TAG_FIELD = "kind"
REQUIRED_FIELDS = (FORMAT_TAG_FIELD, "bits", "count", "files", "params", "model")


class IndexFormatError(ValueError):
    """The index directory is corrupt, incomplete or of an unknown format version or format tag."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_index(index, path, model_version: str | None = None, signature_fingerprint: str | None = None,
               embeddings=None) -> Path | str:  # fmt: skip
    """Write ``index`` to the directory ``path`` atomically: its data files plus ``manifest.json``.

    ``path`` may be a URI of remote storage (``gs://bucket/indexes/3/BFlat``): the index is then
    written to a local temporary folder as below and uploaded file by file, the manifest last, after
    the manifest of an index it replaces was removed: a reader (:func:`parse_manifest`) sees no index
    there, or a complete one, since the manifest is what names and checks every file.

    Any index is written through its ``write_files``, ``format_tag``, ``bits``, ``ntotal``,
    ``exact`` and ``params``. A save writes into a temporary sibling directory and renames it into
    place; an existing index at the path is replaced only after the new one is complete. No pickle
    anywhere: arrays are ``.npy`` with ``allow_pickle=False``, FAISS and ScaNN write their own
    formats.

    Manifest (format version 1)::

        {"format_version": 1, "kind": "binary-flat", "bits": 64, "count": 69000, "id_dtype": "int64", "exact": true,
         "params": {...}, "model": {"version": "3", "signature_fingerprint": "..."},
         "files": {"codes.npy": "<sha256>", ...}, "tfhash_version": "0.1.0", "created": "..."}

    The field ``kind`` holds the index's format tag (``<format family>-<method>``), which names the
    class that reads the directory.

    ``embeddings`` (:class:`tfhash.index.refine.Embeddings`, one per item): written beside the codes
    for the second stage of a search, named and checksummed by the manifest like them, and described
    by the fields they give (:meth:`~tfhash.index.refine.Embeddings.manifest_fields`).
    """
    if embeddings is not None:
        embeddings.check_covers(index)
    if storage.is_uri(path):
        return _upload_index(index, path, model_version, signature_fingerprint, embeddings)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(storage.staging_folder(target.parent, f".{target.name}.tmp-"))
    try:
        with storage.space_reported(target, "the index"):
            index.write_files(staging)
            if embeddings is not None:
                embeddings.write(staging)
        files = {
            p.relative_to(staging).as_posix(): _sha256(p) for p in sorted(staging.rglob("*")) if p.is_file()
        }
        manifest = {
            "format_version": FORMAT_VERSION,
            FORMAT_TAG_FIELD: index.format_tag,
            "bits": index.bits,
            "count": index.ntotal,
            "id_dtype": "int64",
            "exact": index.exact,
            "params": index.params(),
            "model": {"version": model_version, "signature_fingerprint": signature_fingerprint},
            "files": files,
            **({} if embeddings is None else embeddings.manifest_fields()),
            "tfhash_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with storage.space_reported(target, "the index"):
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if target.exists():
            retired = target.with_name(f".{target.name}.old-{os.getpid()}-{time.time_ns()}")
            os.rename(target, retired)
            os.rename(staging, target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _upload_index(index, uri: str, model_version: str | None, signature_fingerprint: str | None, embeddings) -> str:
    """:func:`save_index` to remote storage: staged locally, uploaded with the manifest last; files
    of a replaced index that the new one does not name are removed after."""
    with tempfile.TemporaryDirectory(prefix="tfhash-index-upload-") as local:
        staged = save_index(index, os.path.join(local, "index"), model_version, signature_fingerprint, embeddings)
        before = {name for name, _, _ in storage.files_under(uri)}
        storage.remove(storage.join(uri, MANIFEST))
        storage.copy_tree(staged, uri, last=MANIFEST)
        now = {name for name, _, _ in storage.files_under(staged)}
    for name in sorted(before - now):
        storage.remove(storage.join(uri, name))
    return uri


def parse_manifest(path, format_tags: Collection[str]) -> dict:
    """Parse and check the manifest of the index directory ``path``, which must record one of
    ``format_tags``.

    Raises:
        IndexFormatError: missing or unparsable manifest, unknown format version or format tag.
    """
    manifest_path = storage.join(path, MANIFEST)
    try:
        manifest = json.loads(storage.read_bytes(manifest_path))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as err:
        raise IndexFormatError(f"{path}: no {MANIFEST}; not a tfhash index directory") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise IndexFormatError(f"{manifest_path}: not valid JSON ({err})") from err
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise IndexFormatError(
            f"{path}: index format version {version!r} is not supported (this tfhash reads version {FORMAT_VERSION})"
        )
    for key in REQUIRED_FIELDS:
        if key not in manifest:
            raise IndexFormatError(f"{manifest_path}: missing field {key!r}")
    if not isinstance(manifest["model"], dict):
        raise IndexFormatError(f"{manifest_path}: field 'model' must be an object {{\"version\", \"signature_fingerprint\"}}")
    if manifest[FORMAT_TAG_FIELD] not in format_tags:
        raise IndexFormatError(
            f"{path}: unknown index format tag {manifest[FORMAT_TAG_FIELD]!r} (field {FORMAT_TAG_FIELD!r}); "
            f"this tfhash reads {', '.join(sorted(format_tags))}"
        )
    return manifest


def on_local_copy(path: str, read: Callable):
    """``read(folder)`` of the local copy of the index directory at the URI ``path``
    (:func:`tfhash.storage.local_copy`: downloaded once, shared by the processes that read the same
    files). A copy ``read`` refuses is downloaded again once (it may be an earlier content of the
    same sizes and times); an IndexFormatError then names the URI."""
    local = storage.local_copy(path, "indexes")
    try:
        return read(local)
    except IndexFormatError:
        local = storage.local_copy(path, "indexes", fresh=True)
    try:
        return read(local)
    except IndexFormatError as err:
        raise IndexFormatError(str(err).replace(local, f"{path} (its local copy)")) from err


def verify_files(path, manifest: dict) -> None:
    """Check that every file named by the manifest exists with the recorded sha256 (under a URI:
    in its local copy, :func:`tfhash.storage.local_copy`, which loading it then reuses)."""
    if storage.is_uri(path):
        return on_local_copy(path, lambda local: verify_files(local, manifest))
    for name, digest in manifest["files"].items():
        file_path = Path(path) / name
        if not file_path.is_file():
            raise IndexFormatError(f"{path}: file {name} named by the manifest is missing")
        if _sha256(file_path) != digest:
            raise IndexFormatError(f"{path}: checksum mismatch for {name}: the file is corrupt or was modified")


#: What an index records of its model: manifest ``model`` field, its name in messages, and the
#: ``save`` parameter that records it.
MODEL_FIELDS = (("version", "model version", "model_version"),
                ("signature_fingerprint", "SavedModel signature fingerprint", "signature_fingerprint"))  # fmt: skip


def check_model(path, manifest: dict, expected_model_version: str | None = None,
                expected_signature_fingerprint: str | None = None) -> None:  # fmt: skip
    """Refuse the index directory ``path`` (its checked ``manifest`` given) when it was built from
    another model than the expected one; an expectation left ``None`` is not checked.

    The one check of an index against its model: :func:`open_index` runs it on load, the search
    service on the pairs it serves.

    Raises:
        IndexFormatError: the manifest records another model version or SavedModel signature
            fingerprint than expected (the message names both), or none where one is expected
            (an index that cannot be checked must not pass for a checked one).
    """
    expected = {"version": None if expected_model_version is None else str(expected_model_version),
                "signature_fingerprint": expected_signature_fingerprint}  # fmt: skip
    for field, what, save_param in MODEL_FIELDS:
        want, recorded = expected[field], manifest["model"].get(field)
        if want is None:
            continue
        if not recorded:
            raise IndexFormatError(f"{path}: index records no {what}, so it cannot be checked against {want!r}; "
                                   f"rebuild the index from this model and save it with {save_param}={want!r}")  # fmt: skip
        if recorded != want:
            raise IndexFormatError(f"{path}: index was built for {what} {recorded!r}, not {want!r}; rebuild the "
                                   f"index from this model, or load the model it was built with")  # fmt: skip


def open_index(path, manifest: dict, read_files: Callable, expected_model_version: str | None = None,
               expected_signature_fingerprint: str | None = None, mapped: bool = False):  # fmt: skip
    """Read the index directory ``path`` whose checked ``manifest`` is given, with ``read_files``
    (the class's ``read_files(directory, manifest, mapped)``), after :func:`check_model` and
    verifying the checksums.

    Raises:
        IndexFormatError: corrupt files, another model than expected, or a count the files
            disagree with.
    """
    check_model(path, manifest, expected_model_version, expected_signature_fingerprint)
    verify_files(path, manifest)
    index = read_files(path, manifest, mapped)
    if index.ntotal != manifest["count"]:
        raise IndexFormatError(f"{path}: manifest says {manifest['count']} items, files hold {index.ntotal}")
    return index
