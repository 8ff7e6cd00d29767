"""Retrieval indexes over hash codes: a small abstract index (add / search / save / load),
FAISS-backed binary Hamming indexes, ScaNN, a pure-TF Hamming top-k module, and versioned,
checksummed persistence.

    index = index_factory(64, "BFlat")
    index.add(codes, ids)
    result = index.search(queries, k=10)
    index.save("runs/index", model_version="3")
    index = load_index("runs/index", expected_model_version="3")
"""

from tfhash.index.base import HashIndex, IndexError_, SearchResult
from tfhash.index.binary import BinaryIndex
from tfhash.index.factory import index_factory
from tfhash.index.persistence import (
    FORMAT_VERSION,
    IndexFormatError,
    load_index,
    read_manifest,
    save_index,
    verify_files,
)
from tfhash.index.scann_index import ScannIndex

__all__ = [
    "FORMAT_VERSION",
    "BinaryIndex",
    "HashIndex",
    "IndexError_",
    "IndexFormatError",
    "ScannIndex",
    "SearchResult",
    "index_factory",
    "load_index",
    "read_manifest",
    "save_index",
    "verify_files",
]
