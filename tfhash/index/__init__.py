"""Retrieval indexes over hash codes, FAISS-style, with versioned and checksummed persistence.

A small abstract index (add / search / save / load) with binary Hamming indexes (tfhash's exact
kernel, exact multi-index hashing, FAISS IVF and multi-hash), ScaNN, Milvus and a pure-TF Hamming top-k module behind it.
:func:`index_factory` builds one from an index type (``BFlat``, ``BIVF1024``, ...;
:data:`INDEX_TYPES` is the one table of them), and :func:`load_index` reopens a saved one, checked
against its model. :mod:`tfhash.index.refine` is the second stage of a search: Hamming candidates
ordered by the items' continuous embeddings, stored beside the codes.
FAISS, ScaNN and pymilvus (the ``index`` extra) are needed only when an index of theirs is created.
"""

from tfhash.index.base import (
    RANGE_SEARCH,
    TRAIN,
    HashIndex,
    HashIndexError,
    IndexUnavailableError,
    InProcessIndex,
    SearchResult,
)
from tfhash.index.binary import BinaryIndex
from tfhash.index.factory import INDEX_TYPES, IndexType, index_factory, load_index, read_manifest
from tfhash.index.mih import MultiIndexHashing
from tfhash.index.milvus import MilvusIndex
from tfhash.index.persistence import (
    FORMAT_VERSION,
    IndexFormatError,
    check_model,
    save_index,
    verify_files,
)
from tfhash.index.refine import (
    DEFAULT_K_FACTOR,
    Embeddings,
    load_embeddings,
    quantised_rows,
    refined_search,
    rerank,
)
from tfhash.index.scann_index import ScannIndex

__all__ = [
    "DEFAULT_K_FACTOR",
    "FORMAT_VERSION",
    "INDEX_TYPES",
    "RANGE_SEARCH",
    "TRAIN",
    "BinaryIndex",
    "Embeddings",
    "HashIndex",
    "HashIndexError",
    "IndexFormatError",
    "IndexUnavailableError",
    "InProcessIndex",
    "MilvusIndex",
    "MultiIndexHashing",
    "IndexType",
    "ScannIndex",
    "SearchResult",
    "check_model",
    "index_factory",
    "load_embeddings",
    "load_index",
    "quantised_rows",
    "read_manifest",
    "refined_search",
    "rerank",
    "save_index",
    "verify_files",
]
