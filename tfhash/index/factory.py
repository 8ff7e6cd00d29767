"""The index types: one table from the names users write to index classes (:data:`INDEX_TYPES`).

The table (``BFlat``, ``BIVF1024``, ...) is read both to build an empty index
(:func:`index_factory`, in the spirit of FAISS's ``index_factory``) and to open a saved one
(:func:`read_manifest`, :func:`load_index`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tfhash import storage
from tfhash.index.base import HashIndex, HashIndexError
from tfhash.index.binary import BinaryIndex
from tfhash.index.mih import MultiIndexHashing
from tfhash.index.milvus import MilvusIndex
from tfhash.index.persistence import FORMAT_TAG_FIELD, on_local_copy, open_index, parse_manifest
from tfhash.index.scann_index import ScannIndex

__all__ = ["IndexType", "INDEX_TYPES", "FORMAT_TAGS", "index_type_names", "parse_index_type", "index_factory", "read_manifest", "load_index"]


@dataclass(frozen=True)
class IndexType:
    """One row of the type table.

    Each index type is one class and one method of it, so it has one format tag (``binary-flat``,
    ``binary-ivf``, ...); a saved index is read by the class its format tag names.

    Attributes:
        name: what users write (``BIVF``; with ``size_param``, followed by a number: ``BIVF1024``).
        cls: the index class.
        method: the class's search method.
        size_param: the constructor parameter given by the number after the name, or None.
    """

    name: str
    cls: type[HashIndex]
    method: str
    size_param: str | None

    @property
    def spelling(self) -> str:
        """How users write it: ``BFlat``, ``BIVF<nlist>``."""
        return f"{self.name}<{self.size_param}>" if self.size_param else self.name

    @property
    def format_tag(self) -> str:
        """The format tag its indexes record in the manifest, e.g. ``binary-ivf``."""
        return self.cls.format_tag_of(self.method)


#: The type table: index type name -> :class:`IndexType` (the rows listed in :func:`index_factory`).
INDEX_TYPES: dict[str, IndexType] = {
    row.name: row
    for row in (
        IndexType("BFlat", BinaryIndex, "flat", None),
        IndexType("BIVF", BinaryIndex, "ivf", "nlist"),
        IndexType("BMultiHash", BinaryIndex, "multihash", "nhash"),
        IndexType("BMIH", MultiIndexHashing, "mih", None),
        IndexType("ScaNN", ScannIndex, "ah", None),
        IndexType("ScaNNBrute", ScannIndex, "brute", None),
        IndexType("Milvus", MilvusIndex, "flat", None),
    )
}

#: The format tags this version reads, each with its index type.
FORMAT_TAGS: dict[str, IndexType] = {row.format_tag: row for row in INDEX_TYPES.values()}


def index_type_names() -> str:
    """The spellings of every index type, for help texts and error messages."""
    spellings = [row.spelling for row in INDEX_TYPES.values()]
    return ", ".join(spellings[:-1]) + " or " + spellings[-1]


def parse_index_type(text: str) -> tuple[IndexType, dict]:
    """The index type named by ``text`` (``"BIVF1024"``) and the parameter its number gives
    (``{"nlist": 1024}``).

    Raises:
        HashIndexError: an unknown name, or a number missing or where none belongs.
    """
    match = re.fullmatch(r"([A-Za-z]+)(\d*)", text.strip())
    row = INDEX_TYPES.get(match.group(1)) if match else None
    if row is None:
        raise HashIndexError(f"unknown index type {text!r}; use {index_type_names()}")
    number = match.group(2)
    if row.size_param is None:
        if number:
            raise HashIndexError(f"index type {row.name} takes no number, got {text!r}; write {row.name}")
        return row, {}
    if not number:
        raise HashIndexError(f"index type {row.name} needs its {row.size_param} after the name, e.g. {row.name}16, got {text!r}")
    return row, {row.size_param: int(number)}


def index_factory(bits: int, index_type: str, **params) -> HashIndex:
    """Create an empty index of ``bits``-bit codes of ``index_type``; extra keyword parameters go
    to the index's constructor.

    The index types:

    * ``BFlat``: exact Hamming k-NN (compiled kernel, tfhash.hamming);
    * ``BIVF<nlist>``: inverted lists, approximate (``nprobe`` keyword, default 16);
    * ``BMultiHash<nhash>``: multi-index hashing, approximate (``nflip`` keyword, default 1);
    * ``BMIH``: multi-index hashing, exact: ``BFlat``'s answers in sublinear time on clustered
      codes, adds without rebuilding (``tables`` keyword, default chosen from the size);
    * ``ScaNN``: ScaNN tree + asymmetric hashing + reordering, approximate;
    * ``ScaNNBrute``: ScaNN brute force (exact distances, ties in any order);
    * ``Milvus``: a Milvus collection, ``BIN_FLAT`` (exact distances, ties in id order); ``uri``
      and ``collection`` keywords (tfhash.index.milvus).

    Raises:
        HashIndexError: an unknown index type or bad parameters.
        ImportError: the index type's back-end (FAISS, ScaNN or pymilvus) is not installed; the
            message names the extra to install.
        IndexUnavailableError: a Milvus index whose server cannot be reached.
    """
    row, size = parse_index_type(index_type)
    return row.cls(bits, row.method, **size, **params)


def read_manifest(path) -> dict:
    """Parse and check the manifest of the index directory ``path``.

    Raises:
        IndexFormatError: missing or unparsable manifest, unknown format version or format tag.
    """
    return parse_manifest(path, FORMAT_TAGS)


def load_index(path, expected_model_version: str | None = None,
               expected_signature_fingerprint: str | None = None, mapped: bool = False) -> HashIndex:  # fmt: skip
    """Load an index directory after verifying its manifest, its model and its checksums.

    ``path`` may be a URI of remote storage: its files are copied to this machine's cache folder
    (:func:`tfhash.storage.local_copy`) and loaded from there.

    Args:
        mapped: map a flat binary index's codes and ids from its files instead of reading them
            into memory: every process that maps the same directory shares one copy (the page
            cache's). The files must then not change in place while the index is used (a file
            truncated under a mapping kills the process with SIGBUS); directories written by
            :meth:`HashIndex.save` never are, it publishes a new directory atomically. Adding or
            removing items copies the arrays. An IVF index maps its codes and ids too (its FAISS
            lists are read into memory); the other types copy what they load.
        expected_model_version: when given, refuse an index built from another model version, or
            that records none.
        expected_signature_fingerprint: when given, refuse an index built from a SavedModel with
            another signature fingerprint (``tfhash.artifacts.signature_fingerprint``), or that
            records none.

    Raises:
        IndexFormatError: corrupt files, unknown format, or another model than expected
            (:func:`~tfhash.index.persistence.check_model`; for a Milvus index also: a collection
            missing, of another dimension, or locked to another model than its manifest names).
        ImportError: the index's back-end is not installed.
        IndexUnavailableError: a Milvus index whose server cannot be reached.
    """
    if storage.is_uri(path):  # a local copy, shared by the processes that load the same files (mapped: one page cache)
        read_manifest(path)  # no manifest there: not (yet) an index, said of the URI
        return on_local_copy(path, lambda local: load_index(local, expected_model_version, expected_signature_fingerprint, mapped))
    manifest = read_manifest(path)
    row = FORMAT_TAGS[manifest[FORMAT_TAG_FIELD]]
    return open_index(path, manifest, row.cls.read_files, expected_model_version, expected_signature_fingerprint, mapped)
