"""Retrieval indexes over hash codes: a small abstract index (add / search / save / load),
binary Hamming indexes (tfhash's exact kernel, FAISS IVF and multi-hash), ScaNN, Milvus, a pure-TF
Hamming top-k module, and versioned, checksummed persistence.

    index = index_factory(64, "BFlat")
    index.add(codes, ids)
    distances, neighbours = index.search(queries, k=10)  # FAISS's order: distances, then ids
    len(index)  # the items it holds (index.ntotal)
    index.save("runs/index", model_version="3", signature_fingerprint=fingerprint)
    index = load_index("runs/index", expected_model_version="3", expected_signature_fingerprint=fingerprint)

``search`` returns a :class:`SearchResult`, a named tuple that unpacks as above and names its fields
(``result.distances``, ``result.ids``). ``fingerprint`` is the SavedModel's
(:func:`tfhash.artifacts.signature_fingerprint`): loading refuses an index built from another
model version or SavedModel, or that records none to check (:func:`check_model`).

An index type (``BFlat``, ``BIVF1024``, ...) names a class and its search method (``flat``,
``ivf``, ...); :data:`INDEX_TYPES` is the one table of them. FAISS, ScaNN and pymilvus (the
``index`` extra) are needed only when an index of theirs is created.
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
from tfhash.index.milvus import MilvusIndex
from tfhash.index.persistence import (
    FORMAT_VERSION,
    IndexFormatError,
    check_model,
    save_index,
    verify_files,
)
from tfhash.index.scann_index import ScannIndex

__all__ = [
    "FORMAT_VERSION",
    "INDEX_TYPES",
    "RANGE_SEARCH",
    "TRAIN",
    "BinaryIndex",
    "HashIndex",
    "HashIndexError",
    "IndexFormatError",
    "IndexUnavailableError",
    "InProcessIndex",
    "MilvusIndex",
    "IndexType",
    "ScannIndex",
    "SearchResult",
    "check_model",
    "index_factory",
    "load_index",
    "read_manifest",
    "save_index",
    "verify_files",
]
