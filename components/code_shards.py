"""Code shards: a split's packed codes, labels, ids and embeddings as files, in record order, with a manifest.

The Beam encoding job (:class:`tfhash.components.encoding.EncodeToShards`) writes them; the
RetrievalEvaluator streams them into :func:`tfhash.metrics.evaluate_retrieval_sharded` and the
IndexBuilder fills indexes from them, so no stage holds more of the database than one shard
(besides the packed codes an in-memory index keeps by design).
"""

from __future__ import annotations

import hashlib
import io
import json
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tfhash import storage
from tfhash._version import __version__
from tfhash.index.refine import Embeddings

__all__ = ["MANIFEST", "PART_RECORDS", "CodeShardsError", "shard_name", "write_shard", "write_manifest", "CodeShards"]


#: Version 2 added each item's embedding (the second stage of a search, tfhash.index.refine).
FORMAT_VERSION = 2
KIND = "tfhash-code-shards"
MANIFEST = "manifest.json"
#: Records per shard: one shard is the most a worker holds (records in, codes and labels out).
PART_RECORDS = 16384
#: A shard's arrays and their types, in the order :meth:`CodeShards.read` returns them.
_DTYPES = {"codes": np.uint8, "labels": np.uint8, "ids": np.int64, "embeddings": np.int8}
_ARRAYS = tuple(_DTYPES)
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the zip members' date: a shard's bytes depend on its arrays only
#: Manifest fields a reader needs.
REQUIRED_FIELDS = ("signature", "signature_fingerprint", "num_classes", "code_bytes", "count", "sources", "shards")


class CodeShardsError(ValueError):
    """A code-shards directory that is incomplete, corrupt, of another format or of another model."""


def shard_name(source: int, part: int) -> str:
    """The file name of part ``part`` of record file number ``source``."""
    return f"shard-{source:05d}-{part:05d}.npz"


def write_shard(directory: str, source: int, part: int, codes: np.ndarray, labels: np.ndarray, ids: np.ndarray,
                embeddings: np.ndarray) -> dict:  # fmt: skip
    """Write one shard into ``directory``; return its manifest entry (``embeddings``: int8 rows,
    :func:`tfhash.index.refine.quantised_rows`).

    Raises:
        CodeShardsError: arrays whose rows disagree.
    """
    if not len(codes) == len(labels) == len(ids) == len(embeddings):
        raise CodeShardsError(f"shard {shard_name(source, part)}: {len(codes)} codes, {len(labels)} labels, {len(ids)} ids, "
                              f"{len(embeddings)} embeddings")  # fmt: skip
    buffer = io.BytesIO()
    given = dict(zip(_ARRAYS, (codes, labels, ids, embeddings), strict=True))
    arrays = {name: np.ascontiguousarray(array, _DTYPES[name]) for name, array in given.items()}
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:  # np.savez's layout, with a fixed date
        for key, array in arrays.items():
            with archive.open(zipfile.ZipInfo(f"{key}.npy", date_time=_EPOCH), "w") as handle:
                np.lib.format.write_array(handle, array, allow_pickle=False)
    data = buffer.getvalue()
    name = shard_name(source, part)
    storage.write_bytes(storage.join(directory, name), data)  # whole or not at all
    return {"name": name, "source": int(source), "part": int(part), "count": int(len(ids)), "code_bytes": int(codes.shape[1]),
            "sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip


def write_manifest(directory: str, entries: list[dict], *, sources: list[str], signature: str, fingerprint: str,
                   num_classes: int, part_records: int) -> dict:  # fmt: skip
    """Write the manifest of the shards ``entries`` (any order; kept in record order) last, and
    remove what failed attempts left (temporary files, shards no entry names).

    Raises:
        CodeShardsError: no shard at all (a split without records), a record file's parts that
            are not 0..n-1 exactly once, or shards of different code lengths.
    """
    if not entries:
        raise CodeShardsError(f"the record files {sources} hold no records to encode")
    entries = sorted(entries, key=lambda e: (e["source"], e["part"]))
    widths = sorted({e["code_bytes"] for e in entries})
    if len(widths) > 1:
        raise CodeShardsError(f"{directory}: shards of {widths} bytes per code; one model writes one code length")
    code_bytes = widths[0]
    for source in sorted({e["source"] for e in entries}):
        parts = [e["part"] for e in entries if e["source"] == source]
        if parts != list(range(len(parts))):
            raise CodeShardsError(f"record file {sources[source]}: parts {parts} were written; expected each of 0..{len(parts) - 1} once")
    manifest = {"format_version": FORMAT_VERSION, "kind": KIND, "signature": signature, "signature_fingerprint": fingerprint,
                "num_classes": int(num_classes), "code_bytes": int(code_bytes), "count": int(sum(e["count"] for e in entries)),
                "sources": list(sources), "part_records": int(part_records), "shards": entries, "tfhash_version": __version__,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    named = {e["name"] for e in entries} | {MANIFEST}
    for leftover in storage.listdir(directory):  # shards of no record file of this job, what a dead writer left
        if leftover not in named and (leftover.lstrip(".").startswith("shard-") or leftover.lstrip(".").startswith(f"{MANIFEST}.tmp-")):
            storage.remove(storage.join(directory, leftover))
    storage.write_bytes(storage.join(directory, MANIFEST), json.dumps(manifest, indent=1).encode())
    return manifest


@dataclass(frozen=True)
class CodeShards:
    """A checked code-shards directory (:meth:`open`): iterate it for ``(codes, labels, ids)`` per
    shard in record order, each verified as it is read.

    A directory of code shards::

        manifest.json                 written last: its presence means every shard is in
        shard-<file>-<part>.npz       codes uint8 (n, K/8), labels uint8 (n, C), ids int64 (n,),
                                      embeddings int8 (n, K) (quantised_rows)

    Shard ``shard-00003-00001.npz`` holds part 1 (records ``part_records`` .. ``2 * part_records -
    1``) of the fourth record file of the split, files in sorted order: the shards in manifest order
    are the records in the order the in-process encoder reads them, the order mAP@all breaks ties by.

    Manifest (format version 2)::

        {"format_version": 2, "kind": "tfhash-code-shards", "signature": "serving_default",
         "signature_fingerprint": "...", "num_classes": 10, "code_bytes": 8, "count": 69000,
         "sources": ["<record file>", ...], "part_records": 16384,
         "shards": [{"name": "shard-00000-00000.npz", "source": 0, "part": 0, "count": 16384,
                     "code_bytes": 8, "sha256": "..."}, ...],
         "tfhash_version": "0.1.0", "created": "..."}

    Every file is written under a temporary name and renamed into place, so a worker that dies
    mid-shard leaves no shard behind, and a retried shard replaces its first attempt instead of adding
    to it; a shard's bytes are a function of its arrays (no time stamps), so an attempt that finishes
    late writes the same bytes the manifest records. Reading checks the format, the model's
    fingerprint when one is expected, each shard's checksum, shape and count. Paths may be local or
    any filesystem ``tf.io.gfile`` reaches (``gs://``).
    No pickle: arrays are read with ``allow_pickle=False``.
    """

    directory: str
    manifest: dict

    @classmethod
    def open(cls, directory: str, expected_fingerprint: str | None = None, num_classes: int | None = None) -> CodeShards:
        """Read and check ``directory``'s manifest.

        Raises:
            CodeShardsError: no manifest (an incomplete job), another format, a shard written for
                another model (``expected_fingerprint``) or number of classes.
        """
        path = storage.join(directory, MANIFEST)
        try:
            manifest = json.loads(storage.read_bytes(path))
        except FileNotFoundError as err:
            raise CodeShardsError(f"{directory}: no {MANIFEST}; the encoding job did not finish there (run it again)") from err
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CodeShardsError(f"{path}: not valid JSON ({err})") from err
        if not isinstance(manifest, dict) or manifest.get("kind") != KIND or manifest.get("format_version") != FORMAT_VERSION:
            found = (manifest.get("kind"), manifest.get("format_version")) if isinstance(manifest, dict) else (type(manifest).__name__, None)
            raise CodeShardsError(f"{directory}: format {found[0]!r} version {found[1]!r} is not {KIND!r} version {FORMAT_VERSION}")
        missing = [name for name in REQUIRED_FIELDS if name not in manifest]
        if missing:
            raise CodeShardsError(f"{path}: missing fields {missing}; encode the split again")
        recorded = manifest["signature_fingerprint"]
        if expected_fingerprint is not None and recorded != expected_fingerprint:
            raise CodeShardsError(f"{directory}: the codes were encoded by the SavedModel with fingerprint {recorded!r}, not "
                                  f"{expected_fingerprint!r}; encode the split again with this model")  # fmt: skip
        if num_classes is not None and manifest["num_classes"] != num_classes:
            raise CodeShardsError(f"{directory}: the shards hold {manifest['num_classes']} classes, not {num_classes}")
        return cls(directory, manifest)

    @property
    def count(self) -> int:
        return int(self.manifest["count"])

    def __len__(self) -> int:
        return self.count

    def read(self, entry: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One shard's ``(codes, labels, ids)``, checked against its manifest entry.

        Raises:
            CodeShardsError: a missing or corrupt shard, or one whose arrays disagree with the manifest.
        """
        return self._read(entry)[:3]

    def _read(self, entry: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        path = storage.join(self.directory, entry["name"])
        try:
            data = storage.read_bytes(path)
        except Exception as err:  # NotFoundError and the filesystem's own errors
            raise CodeShardsError(f"{path}: shard named by the manifest cannot be read ({err})") from err
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CodeShardsError(f"{path}: checksum mismatch: the shard is corrupt or was replaced; encode the split again")
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            found = tuple(arrays[name] for name in _ARRAYS)
        shapes = self._shapes(entry["count"])
        for name, array in zip(_ARRAYS, found, strict=True):
            if array.shape != shapes[name]:
                raise CodeShardsError(f"{path}: {name} of shape {array.shape}, the manifest says {shapes[name]}")
        return found

    def _shapes(self, count: int) -> dict[str, tuple]:
        """The shape of each of :data:`_ARRAYS` for ``count`` records."""
        code_bytes = self.manifest["code_bytes"]
        return {"codes": (count, code_bytes), "labels": (count, self.manifest["num_classes"]), "ids": (count,),
                "embeddings": (count, code_bytes * 8)}  # fmt: skip

    def _gathered(self, *names: str) -> list[np.ndarray]:
        """The arrays ``names`` (of :data:`_ARRAYS`) of every record, in record order, filled shard
        by shard (one shard in memory beside them)."""
        shapes, columns = self._shapes(self.count), [_ARRAYS.index(name) for name in names]
        out = [np.empty(shapes[name], _DTYPES[name]) for name in names]
        start = 0
        for entry in self.manifest["shards"]:
            found = self._read(entry)
            for array, column in zip(out, columns, strict=True):
                array[start : start + entry["count"]] = found[column]
            start += entry["count"]
        return out

    def verify(self) -> None:
        """Read every shard and check it (:meth:`read`) without keeping it.

        Raises:
            CodeShardsError: as :meth:`read`.
        """
        for entry in self.manifest["shards"]:
            self.read(entry)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        for entry in self.manifest["shards"]:
            yield self.read(entry)

    def codes_and_labels(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(codes, labels)`` per shard in record order, as
        :func:`tfhash.metrics.evaluate_retrieval_sharded` reads a database (one call per pass)."""
        return ((codes, labels) for codes, labels, _ in self)

    def codes_and_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """Every packed code and id, in record order (what an in-memory index keeps)."""
        codes, ids = self._gathered("codes", "ids")
        return codes, ids

    def embeddings(self) -> Embeddings:
        """Every item's embedding with its id (:class:`tfhash.index.refine.Embeddings`), for the
        second stage of the index built from these shards."""
        rows, ids = self._gathered("embeddings", "ids")
        return Embeddings(rows, ids)
