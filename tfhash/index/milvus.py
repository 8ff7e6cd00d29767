"""Milvus as an index back-end: the codes live in a Milvus collection (``BINARY_VECTOR`` field,
``HAMMING`` metric, ``BIN_FLAT`` index), behind the same API as the in-process indexes."""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import uuid
import weakref

import numpy as np

from tfhash._version import __version__
from tfhash.index.base import (
    PACKED,
    RANGE_SEARCH,
    HashIndex,
    HashIndexError,
    IndexUnavailableError,
    SearchResult,
    import_backend,
    next_ids,
    require_backend,
)
from tfhash.index.persistence import IndexFormatError

__all__ = ["LOCKS_COLLECTION", "MAX_RESULTS", "is_local", "normalised", "collection_name", "check_reachable", "MilvusIndex"]


#: The collection, in each Milvus, that holds one lock row per saved tfhash collection.
LOCKS_COLLECTION = "tfhash_index_locks"
#: The environment variable holding the token (``user:password`` or an API key) of a Milvus server.
TOKEN_ENV = "TFHASH_MILVUS_TOKEN"
#: Seconds to wait for Milvus on connection and on each call, unless an index names its own.
DEFAULT_TIMEOUT = 10.0
#: Milvus's limit on the results of one query (``topk``) and on queries per search call.
MAX_RESULTS = 16384
ID_FIELD, CODE_FIELD = "id", "code"
_LOCK_KEY, _LOCK_TEXT, _LOCK_VECTOR = "collection", "lock", "unused"
_BATCH = 10_000  # rows per insert, ids per `id in [...]` filter, queries per search call
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")

# Milvus Lite serves a local file from one server process per file; this process's indexes share
# it and the last one to close releases it (and with it the file lock).
_lite_users: dict[str, int] = {}
_lite_lock = threading.Lock()


def _pymilvus():
    return import_backend("pymilvus", "MilvusIndex")


def is_local(uri: str) -> bool:
    """Whether ``uri`` names a Milvus Lite file rather than a server address."""
    return "://" not in uri


def normalised(uri: str) -> str:
    """``uri`` as indexes record it: a Milvus Lite file made absolute, a server address stripped."""
    return os.path.abspath(uri) if is_local(uri) else uri.strip()


def check_collection_name(name) -> str:
    """A Milvus collection name: a letter or ``_``, then letters, digits and ``_`` (255 at most)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise HashIndexError(f"collection must be a Milvus collection name (a letter or _, then letters, digits "
                             f"or _, at most 255), got {name!r}; e.g. collection=\"items_v3\"")  # fmt: skip
    return name


def collection_name(prefix: str, model_version, modality: str | None = None) -> str:
    """The collection of one model version's index: ``<prefix>_v<version>[_<modality>]``, with
    every character Milvus does not allow in ``prefix`` replaced by ``_`` (each version gets its
    own collection, so the one being served stays until the search service swaps)."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", prefix)
    base = base if base[:1].isalpha() or base[:1] == "_" else f"_{base}"
    return check_collection_name(f"{base}_v{model_version}" + (f"_{re.sub(r'[^A-Za-z0-9_]', '_', modality)}" if modality else ""))


def _connect(uri: str, timeout: float):
    """A ``MilvusClient`` of its own for the Milvus at ``uri`` (as :func:`normalised` writes it);
    close it with :func:`_release`.

    Raises:
        IndexUnavailableError: Milvus cannot be reached at ``uri`` within ``timeout`` seconds (for a
            Milvus Lite file: another process holds it).
    """
    pymilvus = _pymilvus()
    if is_local(uri):
        os.makedirs(os.path.dirname(uri), exist_ok=True)
    try:
        # its own connection (pymilvus shares one per URI otherwise, and closing one would close all)
        client = pymilvus.MilvusClient(uri=uri, token=os.environ.get(TOKEN_ENV, ""), timeout=timeout,
                                       alias=f"tfhash-{uuid.uuid4().hex}")  # fmt: skip
    except Exception as err:  # pymilvus raises MilvusException and its subclasses, grpc errors
        if is_local(uri):
            raise IndexUnavailableError(f"cannot open the Milvus Lite file {uri} ({err}); a Lite file is open in one "
                                        f"process at a time: stop the other one (a search service serving it?) or "
                                        f"use another file") from err  # fmt: skip
        raise IndexUnavailableError(f"cannot reach Milvus at {uri} within {timeout:g} s ({err}); check that the "
                                    f"server runs and the URI is right") from err  # fmt: skip
    if is_local(uri):
        with _lite_lock:
            _lite_users[uri] = _lite_users.get(uri, 0) + 1
    return client


def check_reachable(uri: str, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Connect to the Milvus at ``uri`` and disconnect: a run that will write an index there fails
    before its work, not after it.

    Raises:
        IndexUnavailableError: Milvus cannot be reached at ``uri`` within ``timeout`` seconds (for a
            Milvus Lite file: another process holds it).
    """
    uri = normalised(uri)
    _release(_connect(uri, timeout), uri)


def _release(client, uri: str) -> None:
    """Close ``client``; stop the Milvus Lite server of ``uri`` when no index of this process uses it."""
    client.close()
    if is_local(uri):
        with _lite_lock:
            _lite_users[uri] -= 1
            if _lite_users[uri] == 0:
                del _lite_users[uri]
                from milvus_lite.server_manager import server_manager_instance

                server_manager_instance.release_server(uri)


def _ids_filter(ids: np.ndarray) -> str:
    return f"{ID_FIELD} in [{','.join(str(int(i)) for i in ids)}]"


class MilvusIndex(HashIndex):
    """Hamming k-NN and range search over codes kept in a Milvus collection, with int64 ids.

        index = index_factory(64, "Milvus", uri="runs/milvus.db", collection="items_v3")
        index.add(codes, ids)
        index.save("runs/index/3/Milvus", model_version="3", signature_fingerprint=fp)
        index = load_index("runs/index/3/Milvus", expected_model_version="3", expected_signature_fingerprint=fp)

    ``uri`` is either a local file, served by the embedded Milvus Lite (tests, the demo, one process
    at a time: Milvus Lite locks the file), or the address of a Milvus server or cluster
    (``http://host:19530``). A token for a server that needs one is read from the environment variable
    :data:`TOKEN_ENV` and never written anywhere.

    The index directory that :meth:`MilvusIndex.save` writes holds no data, only the manifest naming
    the URI, the collection and the model version, like every index directory. The model-version lock
    is kept in Milvus too: ``save`` writes a lock row (model version, signature fingerprint, bits,
    count) into the collection :data:`LOCKS_COLLECTION` of the same Milvus, and every change made
    through tfhash (add, remove, upsert) deletes it first. Loading checks the manifest against the
    expected model (:func:`~tfhash.index.persistence.check_model`, before connecting), then the
    collection's dimension, its lock against the manifest (a collection rebuilt or changed since the
    save is refused) and its item count: the collection is checked against the expected model through
    its manifest. Changes made to the collection by other Milvus clients are not seen by the lock
    except through the count.

    Answers: ``BIN_FLAT`` scans every code, so distances are exact; Milvus orders equal distances as
    it likes, so at the k-th distance the ids may differ from ``BFlat``'s (ties). Within one answer,
    ties are returned in ascending id order. Milvus answers at most :data:`MAX_RESULTS` results per
    query: a larger ``k`` is refused, and a range search that reaches the limit raises instead of
    returning a truncated list. Milvus keeps no insertion order, so :meth:`MilvusIndex.ids` returns
    the ids in ascending order.

    Milvus Lite 2.5 is the last version with binary vectors, and it builds only ``BIN_FLAT``; the IVF
    index types of a Milvus server are not offered here because they cannot be tested without one.

    Creating one creates its collection (``BIN_FLAT``, ``HAMMING``, strong consistency); an
    existing collection of that name is refused unless ``replace=True``, which drops it first.
    :func:`~tfhash.index.factory.load_index` opens a saved one.

    Args:
        bits: code length K (multiple of 8), the dimension of the binary vectors.
        method: ``"flat"`` (``BIN_FLAT``).
        uri: a Milvus Lite file (made absolute) or a server address such as ``http://host:19530``.
        collection: the collection name.
        timeout: seconds to wait for the server on connection and on each call.
        replace: drop an existing collection of that name (not recorded in the manifest).

    Capabilities: :data:`~tfhash.index.base.RANGE_SEARCH`.

    Raises:
        HashIndexError: a missing or invalid ``uri`` or ``collection``, or an existing collection
            without ``replace``.
        IndexUnavailableError: Milvus cannot be reached at ``uri`` within ``timeout``.
    """

    format_family = "milvus"
    methods = ("flat",)
    exact_methods = frozenset()  # exact distances, but ties at the k-th distance in Milvus's order
    row_layout = PACKED
    capabilities = frozenset({RANGE_SEARCH})

    def __init__(self, bits: int, method: str = "flat", uri: str | None = None, collection: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, replace: bool = False, *, _create: bool = True):  # fmt: skip
        require_backend("pymilvus", "MilvusIndex")
        super().__init__(bits, method)
        if not isinstance(uri, str) or not uri.strip():
            raise HashIndexError("a Milvus index needs uri=: a Milvus Lite file such as runs/milvus.db, or a server "
                                 "address such as http://localhost:19530")  # fmt: skip
        self.uri = normalised(uri)
        self.collection = check_collection_name(collection)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise HashIndexError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self._client, self._count = _connect(self.uri, self.timeout), 0
        # an index dropped without close() (a pair the search service swapped out or failed to load)
        # releases its connection once unreferenced; close() runs the same release at once
        self._closer = weakref.finalize(self, _release, self._client, self.uri)
        try:
            if _create:
                self._create(replace)
            else:
                self._open()
        except BaseException:
            self.close()
            raise

    # --- connection ----------------------------------------------------------------------------

    def _call(self, what: str, method: str, *args, **kwargs):
        """``self._client.<method>(...)``, a Milvus failure turned into :class:`IndexUnavailableError`."""
        if self._client is None:
            raise HashIndexError(f"the Milvus index {self.collection} at {self.uri} is closed; load it again")
        try:
            # pymilvus stops retrying after `timeout` seconds only when it is an int (else after 75 retries)
            return getattr(self._client, method)(*args, timeout=max(1, math.ceil(self.timeout)), **kwargs)
        except Exception as err:
            raise IndexUnavailableError(f"Milvus at {self.uri} failed to {what} (collection {self.collection}): {err}") from err

    def close(self) -> None:
        """Close the connection; the last index of this process on a Milvus Lite file stops its
        server, which frees the file for other processes. An index that is no longer referenced
        is closed the same way when it is collected."""
        if self._client is not None:
            self._client = None
            self._closer()

    # --- the collection ------------------------------------------------------------------------

    def _create(self, replace: bool) -> None:
        pymilvus = _pymilvus()
        if self._call("list collections", "has_collection", self.collection):
            if not replace:
                raise HashIndexError(f"collection {self.collection} already exists in Milvus at {self.uri}; pick "
                                     f"another name, load it with load_index(<its index directory>), or pass replace=True to drop it")  # fmt: skip
            self._clear_lock()
            self._call("drop the collection", "drop_collection", self.collection)
        schema = pymilvus.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False,
                                                     description=f"tfhash {self.bits}-bit hash codes")  # fmt: skip
        schema.add_field(ID_FIELD, pymilvus.DataType.INT64, is_primary=True)
        schema.add_field(CODE_FIELD, pymilvus.DataType.BINARY_VECTOR, dim=self.bits)
        self._create_collection(self.collection, schema, CODE_FIELD)

    def _create_collection(self, name: str, schema, vector_field: str) -> None:
        params = self._client.prepare_index_params()
        params.add_index(field_name=vector_field, index_type="BIN_FLAT", metric_type="HAMMING")
        self._call("create a collection", "create_collection", name, schema=schema, index_params=params,
                   consistency_level="Strong")  # fmt: skip

    def _open(self) -> None:
        """Open the existing collection: it must hold binary vectors of :attr:`bits`."""
        if not self._call("list collections", "has_collection", self.collection):
            raise IndexFormatError(f"collection {self.collection} does not exist in Milvus at {self.uri}; "
                                   f"it was dropped, or the URI is not the one the index was built in")  # fmt: skip
        fields = {field["name"]: field for field in self._call("describe the collection", "describe_collection", self.collection)["fields"]}
        dim = fields.get(CODE_FIELD, {}).get("params", {}).get("dim")
        if dim is None or int(dim) != self.bits:
            raise IndexFormatError(f"collection {self.collection} in Milvus at {self.uri} holds "
                                   + (f"{dim}-bit codes" if dim is not None else f"no {CODE_FIELD!r} vector field")
                                   + f", the index is of {self.bits}-bit codes; it was rebuilt by another model: build the index again")  # fmt: skip
        self._call("load the collection", "load_collection", self.collection)
        self._count = self._query_count()

    def _query_count(self) -> int:
        rows = self._call("count the items", "query", self.collection, filter="", output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    # --- the lock ------------------------------------------------------------------------------

    def _locks_ready(self) -> bool:
        """Whether the locks collection exists (created on the first save)."""
        return bool(self._call("list collections", "has_collection", LOCKS_COLLECTION))

    def _write_lock(self, lock: dict) -> None:
        pymilvus = _pymilvus()
        if not self._locks_ready():
            schema = pymilvus.MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False,
                                                         description="tfhash: the model version each saved collection is locked to")  # fmt: skip
            schema.add_field(_LOCK_KEY, pymilvus.DataType.VARCHAR, is_primary=True, max_length=256)
            schema.add_field(_LOCK_TEXT, pymilvus.DataType.VARCHAR, max_length=8192)
            schema.add_field(_LOCK_VECTOR, pymilvus.DataType.BINARY_VECTOR, dim=8)  # Milvus needs a vector field
            self._create_collection(LOCKS_COLLECTION, schema, _LOCK_VECTOR)
        self._call("write the lock", "upsert", LOCKS_COLLECTION,
                   [{_LOCK_KEY: self.collection, _LOCK_TEXT: json.dumps(lock), _LOCK_VECTOR: b"\0"}])  # fmt: skip

    def _read_lock(self) -> dict | None:
        if not self._locks_ready():
            return None
        self._call("load the locks", "load_collection", LOCKS_COLLECTION)
        rows = self._call("read the lock", "query", LOCKS_COLLECTION, filter=f'{_LOCK_KEY} == "{self.collection}"',
                          output_fields=[_LOCK_TEXT])  # fmt: skip
        return json.loads(rows[0][_LOCK_TEXT]) if rows else None

    def _clear_lock(self) -> None:
        """Forget the saved state: the collection is about to change."""
        if self._locks_ready():
            self._call("clear the lock", "delete", LOCKS_COLLECTION, ids=[self.collection])

    def check_lock(self, model: dict) -> None:
        """Refuse a collection whose lock is missing or names another model than ``model`` (the
        manifest's ``{"version", "signature_fingerprint"}``)."""
        lock = self._read_lock()
        if lock is None:
            raise IndexFormatError(f"collection {self.collection} in Milvus at {self.uri} has no tfhash lock: it changed "
                                   f"after the index was saved (or tfhash did not save it); build and save the index again")  # fmt: skip
        for key in ("version", "signature_fingerprint"):
            if lock["model"].get(key) != model.get(key):
                raise IndexFormatError(f"collection {self.collection} in Milvus at {self.uri} is locked to model "
                                       f"{key.replace('_', ' ')} {lock['model'].get(key)!r}, the index directory names "
                                       f"{model.get(key)!r}: the collection was rebuilt by another model version")  # fmt: skip

    # --- storage primitives --------------------------------------------------------------------

    @property
    def ntotal(self) -> int:
        return self._count

    def settings(self) -> dict:
        return {"uri": self.uri, "collection": self.collection, "timeout": self.timeout}

    def ids(self) -> np.ndarray:
        """The ids in ascending order (Milvus keeps no insertion order)."""
        if self._count == 0:
            return np.zeros(0, np.int64)
        iterator = self._call("list the ids", "query_iterator", self.collection, batch_size=_BATCH, filter="",
                              output_fields=[ID_FIELD])  # fmt: skip
        found = []
        try:
            while batch := iterator.next():
                found.extend(row[ID_FIELD] for row in batch)
        except Exception as err:
            raise IndexUnavailableError(f"Milvus at {self.uri} failed to list the ids of {self.collection}: {err}") from err
        finally:
            iterator.close()
        return np.sort(np.asarray(found, dtype=np.int64))

    def _existing(self, ids: np.ndarray) -> np.ndarray:
        found = []
        for start in range(0, ids.size, _BATCH):
            rows = self._call("look up ids", "query", self.collection, filter=_ids_filter(ids[start : start + _BATCH]),
                              output_fields=[ID_FIELD])  # fmt: skip
            found.extend(row[ID_FIELD] for row in rows)
        return ids[np.isin(ids, np.asarray(found, dtype=np.int64))]

    def _next_ids(self, count: int) -> np.ndarray:
        return next_ids(self.ids(), count)

    def _insert(self, rows: np.ndarray, ids: np.ndarray) -> None:
        self._clear_lock()
        for start in range(0, rows.shape[0], _BATCH):  # one insert call is all or nothing
            batch = [{ID_FIELD: int(i), CODE_FIELD: row.tobytes()}
                     for i, row in zip(ids[start : start + _BATCH], rows[start : start + _BATCH], strict=True)]  # fmt: skip
            self._call("insert codes", "insert", self.collection, batch)
            self._count += len(batch)

    def _delete(self, ids: np.ndarray) -> int:
        present = self._existing(ids)
        if present.size:
            self._clear_lock()
            for start in range(0, present.size, _BATCH):
                batch = present[start : start + _BATCH].tolist()
                self._call("delete items", "delete", self.collection, ids=batch)
                self._count -= len(batch)
        return int(present.size)

    # --- queries -------------------------------------------------------------------------------

    def _milvus_search(self, rows: np.ndarray, limit: int, params: dict) -> list[list[dict]]:
        hits = []
        for start in range(0, rows.shape[0], _BATCH):
            hits.extend(self._call("search", "search", self.collection, data=[row.tobytes() for row in rows[start : start + _BATCH]],
                                   limit=limit, anns_field=CODE_FIELD, search_params={"metric_type": "HAMMING", "params": params}))  # fmt: skip
        return hits

    @staticmethod
    def _sorted(hits: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        """Distances and ids of one query's hits, nearest first, equal distances by ascending id."""
        distances = np.asarray([hit["distance"] for hit in hits], dtype=np.int32)
        ids = np.asarray([hit["id"] for hit in hits], dtype=np.int64)
        order = np.lexsort((ids, distances))
        return distances[order], ids[order]

    def _search(self, rows: np.ndarray, k: int) -> SearchResult:
        if k > MAX_RESULTS:
            raise HashIndexError(f"k = {k} is above Milvus's limit of {MAX_RESULTS} results per query; ask for fewer")
        distances = np.full((rows.shape[0], k), np.iinfo(np.int32).max, dtype=np.int32)
        ids = np.full((rows.shape[0], k), -1, dtype=np.int64)
        for i, hits in enumerate(self._milvus_search(rows, k, {})):
            d, found = self._sorted(hits)
            distances[i, : d.size], ids[i, : d.size] = d, found
        return SearchResult(distances, ids)

    def _range_search(self, rows: np.ndarray, radius: int) -> list[SearchResult]:
        limit = min(self._count, MAX_RESULTS)
        results = []
        for i, hits in enumerate(self._milvus_search(rows, limit, {"radius": radius + 1, "range_filter": 0})):  # Milvus: d < radius
            if len(hits) == MAX_RESULTS and self._count > MAX_RESULTS:
                raise HashIndexError(f"query {i} has more than {MAX_RESULTS} items within radius {radius}, and Milvus "
                                     f"returns at most {MAX_RESULTS} per query; use a smaller radius, or search(k=...)")  # fmt: skip
            results.append(SearchResult(*self._sorted(hits)))
        return results

    # --- files ---------------------------------------------------------------------------------

    def save(self, path, model_version: str | None = None, signature_fingerprint: str | None = None,
             embeddings=None) -> None:  # fmt: skip
        """Lock the collection to the model (a lock row in :data:`LOCKS_COLLECTION`), then write
        the index directory ``path`` that points at it (with the items' ``embeddings`` in it when
        given: the second stage of a search reads them there, not from Milvus)."""
        self._write_lock({"model": {"version": model_version, "signature_fingerprint": signature_fingerprint},
                          "bits": self.bits, "count": self._count, "tfhash_version": __version__,
                          "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})  # fmt: skip
        super().save(path, model_version, signature_fingerprint, embeddings)

    def write_files(self, directory) -> None:
        """No data files: the manifest's params name the URI and the collection."""
        return None

    @classmethod
    def read_files(cls, directory, manifest: dict, mapped: bool = False) -> MilvusIndex:
        """Open the collection the manifest names and check its dimension and lock."""
        params = dict(manifest["params"])
        method = params.pop(cls.method_param, cls.methods[0])
        index = cls(manifest["bits"], method, **params, _create=False)
        try:
            index.check_lock(manifest["model"])
        except BaseException:
            index.close()
            raise
        return index
