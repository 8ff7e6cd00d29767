"""The abstract index every tfhash index implements (add / search / save / load)."""

from __future__ import annotations

import abc
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterable
from typing import ClassVar, NamedTuple

import numpy as np

from tfhash.codes import as_packed, check_bits, unpack_codes
from tfhash.index.persistence import FORMAT_TAG_FIELD, save_index

__all__ = ["TRAIN", "RANGE_SEARCH", "BACKEND_EXTRA", "BACKEND_PACKAGES", "HashIndexError", "IndexUnavailableError", "SearchResult", "require_backend", "import_backend", "next_ids", "HashIndex", "InProcessIndex"]


#: Capability: ``index.train(codes)`` takes training codes before (or instead of) the first add.
TRAIN = "train"
#: Capability: ``index.range_search(queries, radius)`` returns every item within a Hamming radius.
RANGE_SEARCH = "range_search"

#: How an index stores its rows: packed ``uint8`` bits, or ``float32`` vectors of K values.
PACKED, VECTORS = "packed", "vectors"

#: The file of the external ids in an index directory.
IDS_FILE = "ids.npy"

#: The optional-dependency extra of tfhash that installs the index back-ends.
BACKEND_EXTRA = "index"
#: The pip package that provides each back-end module.
BACKEND_PACKAGES = {"faiss": "faiss-cpu", "scann": "scann", "pymilvus": "pymilvus"}


class HashIndexError(ValueError):
    """Invalid use of an index (bad k, unknown or repeated ids, wrong code width, a capability
    the index lacks)."""


class IndexUnavailableError(RuntimeError):
    """The store that holds an index's items cannot be reached or failed (a Milvus server down, a
    timeout); the request may succeed later. Invalid use is :class:`HashIndexError` instead."""


class SearchResult(NamedTuple):
    """``distances`` and ``ids`` of shape ``(queries, k)``, nearest first (a range search: one
    result of 1-D arrays per query). A tuple in FAISS's order, so ``distances, ids =
    index.search(queries, k)`` unpacks it, and ``result.distances`` / ``result.ids`` name them."""

    distances: np.ndarray
    ids: np.ndarray


def missing_backend_error(module: str, needed_by: str) -> ImportError:
    """The ImportError for a back-end module that is not installed, naming the extra to install."""
    package = BACKEND_PACKAGES.get(module, module)
    return ImportError(
        f"{needed_by} needs the optional package {package} (module {module!r}), which is not installed; "
        f'install it with: pip install "tfhash[{BACKEND_EXTRA}]"'
    )


def require_backend(module: str, needed_by: str) -> None:
    """Raise :func:`missing_backend_error` when ``module`` cannot be found (without importing it)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise missing_backend_error(module, needed_by)


def import_backend(module: str, needed_by: str):
    """Import the back-end ``module``, or raise :func:`missing_backend_error`."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise missing_backend_error(module, needed_by) from err


def validate_k(k: int, ntotal: int) -> int:
    """``k`` as an ``int`` in ``1..ntotal``."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise HashIndexError(f"k must be an integer, got {k!r}")
    if k <= 0:
        raise HashIndexError(f"k must be >= 1, got {k}")
    if k > ntotal:
        raise HashIndexError(f"k = {k} is larger than the {ntotal} items in the index; ask for at most {ntotal}")
    return int(k)


def validate_radius(radius) -> int:
    """A Hamming radius as an ``int`` >= 0."""
    if isinstance(radius, bool) or not isinstance(radius, (int, np.integer)):
        raise HashIndexError(f"radius must be an integer, got {radius!r}")
    if radius < 0:
        raise HashIndexError(f"radius must be >= 0, got {radius}")
    return int(radius)


def validate_ids(ids, count: int) -> np.ndarray:
    """Return ``int64`` ids of length ``count``; refuse negative ids (``-1`` marks "nothing found" in
    a search result, as in FAISS) and duplicates within the batch."""
    ids = np.asarray(ids)
    if ids.shape != (count,):
        raise HashIndexError(f"expected {count} ids (one per code), got shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise HashIndexError(f"ids must be integers, got {ids.dtype}; pass int64 ids")
    ids = ids.astype(np.int64)
    if ids.size and ids.min() < 0:
        raise HashIndexError(f"ids must be >= 0 (-1 marks 'nothing found' in a search result); got {ids[ids < 0][:5].tolist()}")
    values, counts = np.unique(ids, return_counts=True)
    if values.size != ids.size:
        raise HashIndexError(f"ids must be unique; repeated: {values[counts > 1][:5].tolist()}")
    return ids


def _gathered(batches: Iterable[tuple], count: int, read_rows: Callable) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The rows (read by ``read_rows``) and ids of ``(codes, ids)`` batches in one array each,
    filled batch by batch; ids ``None`` when no batch carries any. Refuses batches that hold
    another number of codes than ``count``, or carry ids in some batches only."""
    rows = ids = None
    at = 0
    for codes, batch_ids in batches:
        part = read_rows(codes, "codes")
        if at + part.shape[0] > count:
            raise HashIndexError(f"the batches hold more than the {count} codes announced; pass their number as count")
        if rows is None:
            rows = np.empty((count, *part.shape[1:]), part.dtype)
            ids = None if batch_ids is None else np.empty(count, np.int64)
        if (batch_ids is None) != (ids is None):
            raise HashIndexError("some batches carry ids and some do not: give ids with every batch, or with none (automatic ids)")
        rows[at : at + part.shape[0]] = part
        if ids is not None:
            given = np.asarray(batch_ids)
            if given.shape != (part.shape[0],) or (given.size and not np.issubdtype(given.dtype, np.integer)):
                raise HashIndexError(f"a batch of {part.shape[0]} codes carries ids of {given.dtype} {given.shape}; "
                                     f"expected {part.shape[0]} integer ids")  # fmt: skip
            ids[at : at + part.shape[0]] = given
        at += part.shape[0]
    if at != count:
        raise HashIndexError(f"the batches hold {at} codes, {count} were announced; pass their number as count")
    return rows, ids


def next_ids(existing: np.ndarray, count: int) -> np.ndarray:
    """Automatic ids for ``count`` new items: consecutive, after the largest id in ``existing``."""
    start = int(existing.max()) + 1 if existing.size else 0
    return np.arange(start, start + count, dtype=np.int64)


def packed_rows(codes, bits: int, name: str) -> np.ndarray:
    """``codes`` (+-1 or packed ``uint8``) as packed ``uint8`` rows of ``bits`` bits."""
    try:
        packed = as_packed(codes, name)
    except (ValueError, TypeError) as err:
        raise HashIndexError(f"{err}; the index holds {bits}-bit codes") from err
    if packed.shape[1] * 8 != bits:
        raise HashIndexError(
            f"{name} have {packed.shape[1] * 8} bits, the index holds {bits}-bit codes; "
            f"pass +-1 codes of shape (n, {bits}) or packed uint8 of shape (n, {bits // 8})"
        )
    return packed


def vector_rows(codes, bits: int, name: str) -> np.ndarray:
    """``codes`` (packed ``uint8``, +-1 or continuous values) as finite ``float32`` rows of
    ``bits`` values."""
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise HashIndexError(f"{name} must be 2-D (items x bits), got shape {codes.shape}")
    if codes.dtype == np.uint8:
        codes = unpack_codes(codes)
    vectors = codes.astype(np.float32)
    if vectors.shape[1] != bits:
        raise HashIndexError(
            f"{name} have {vectors.shape[1]} values per row, the index holds {bits}-bit codes; "
            f"pass rows of {bits} values or packed uint8 of shape (n, {bits // 8})"
        )
    if not np.all(np.isfinite(vectors)):
        raise HashIndexError(f"{name} contain NaN or infinity; pass finite values")
    return vectors


_ROW_READERS = {PACKED: packed_rows, VECTORS: vector_rows}
_ROW_DTYPES = {PACKED: np.uint8, VECTORS: np.float32}


def empty_rows(layout: str, bits: int) -> np.ndarray:
    """No rows, in the shape and dtype of ``layout``."""
    return np.zeros((0, bits // 8 if layout == PACKED else bits), dtype=_ROW_DTYPES[layout])


class HashIndex(abc.ABC):
    """Codes with int64 external ids, wherever a subclass keeps them.

    Words used across :mod:`tfhash.index`:

    * **index type**: the name a user writes to ask for an index, ``BFlat``, ``BIVF1024``, ``ScaNN``,
      ``Milvus`` (the table in :mod:`tfhash.index.factory`);
    * **method**: the search method inside one index class, ``flat`` / ``ivf`` / ``multihash`` for
      :class:`~tfhash.index.binary.BinaryIndex`, ``ah`` / ``brute`` for
      :class:`~tfhash.index.scann_index.ScannIndex`;
    * **format tag**: ``<format family>-<method>``, e.g. ``binary-flat``, recorded in an index
      directory's manifest (under the field ``kind``) so that a loader knows which class reads it.

    :class:`HashIndex` owns what every index shares wherever its items live: the checks on codes,
    queries, ids and ``k``, automatic ids, upsert, the declared capabilities and the manifest. Where
    the items are kept is a subclass's: it implements the storage primitives ``ntotal``, ``ids``,
    ``_insert``, ``_delete`` (and may speed up ``_existing`` / ``_next_ids``) and ``_search``.
    :class:`InProcessIndex` keeps rows and ids in this process, in insertion order, and writes them
    into the index directory; its subclasses implement only their search structure through the
    ``_add_rows`` / ``_items_removed`` / ``_search`` hooks (plus ``_train`` and ``_range_search``
    when they declare those capabilities). :class:`~tfhash.index.milvus.MilvusIndex` keeps its items
    in a Milvus collection, and its index directory only points at it.

    Class attributes a subclass sets:
        format_family: first part of the format tag (``binary``, ``scann``, ``milvus``).
        methods: the search methods the class offers; the first is the default.
        exact_methods: the methods whose k-NN answers are exact (distances, and ties in
            insertion order).
        method_param: the params key under which the manifest records the method (kept as
            written by earlier versions, so their index directories still load).
        row_layout: :data:`PACKED` or :data:`VECTORS`, how codes and queries are read.
        capabilities: the optional operations the class implements (:data:`TRAIN`,
            :data:`RANGE_SEARCH`); see :meth:`supports`.
    """

    format_family: ClassVar[str] = ""
    methods: ClassVar[tuple[str, ...]] = ()
    exact_methods: ClassVar[frozenset[str]] = frozenset()
    method_param: ClassVar[str] = "method"
    row_layout: ClassVar[str] = PACKED
    capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, bits: int, method: str):
        try:
            self.bits = check_bits(bits)
        except ValueError as err:  # the codes' rule, refused as an index error
            raise HashIndexError(str(err)) from None
        if method not in self.methods:
            raise HashIndexError(
                f"unknown {type(self).__name__} method {method!r}; choose one of {', '.join(self.methods)}"
            )
        self.method = method

    # --- what the index is -------------------------------------------------------------------

    @classmethod
    def format_tag_of(cls, method: str) -> str:
        """The format tag of this class's ``method``, e.g. ``binary-flat``."""
        return f"{cls.format_family}-{method}"

    @property
    def format_tag(self) -> str:
        """The format tag recorded in the manifest, e.g. ``binary-flat``."""
        return self.format_tag_of(self.method)

    @property
    def exact(self) -> bool:
        """Whether k-NN answers are exact (distances and ties in insertion order)."""
        return self.method in self.exact_methods

    def supports(self, capability: str) -> bool:
        """Whether the index declares ``capability`` (:data:`TRAIN`, :data:`RANGE_SEARCH`)."""
        return capability in self.capabilities

    def _require(self, capability: str) -> None:
        if not self.supports(capability):
            have = ", ".join(sorted(self.capabilities)) or "none"
            raise HashIndexError(
                f"a {self.format_tag} index ({type(self).__name__}) has no {capability} capability "
                f"(it has: {have}); check index.supports({capability!r}) first or build an index type "
                f"that declares it"
            )

    @abc.abstractmethod
    def settings(self) -> dict:
        """The constructor parameters besides ``bits`` and the method (JSON-ready)."""

    def params(self) -> dict:
        """The parameters recorded in the manifest: the method under :attr:`method_param`, then
        :meth:`settings`."""
        return {self.method_param: self.method, **self.settings()}

    @classmethod
    def from_params(cls, bits: int, params: dict) -> HashIndex:
        """An empty index built from manifest ``params`` (the inverse of :meth:`params`)."""
        settings = dict(params)
        method = settings.pop(cls.method_param, cls.methods[0])
        return cls(bits, method, **settings)

    def describe(self) -> dict:
        """Format tag (under the manifest's field name), bits, count, exactness and params."""
        return {FORMAT_TAG_FIELD: self.format_tag, "bits": self.bits, "count": self.ntotal, "exact": self.exact,
                "params": self.params()}  # fmt: skip

    # --- storage primitives (where the items live) -------------------------------------------

    @property
    @abc.abstractmethod
    def ntotal(self) -> int:
        """How many items the index holds."""

    @abc.abstractmethod
    def ids(self) -> np.ndarray:
        """The external ids (insertion order where the store keeps one)."""

    @abc.abstractmethod
    def _insert(self, rows: np.ndarray, ids: np.ndarray) -> None:
        """Store checked rows under checked, new ids."""

    @abc.abstractmethod
    def _delete(self, ids: np.ndarray) -> int:
        """Delete the items with these ids (unknown ones ignored); return how many went."""

    def _existing(self, ids: np.ndarray) -> np.ndarray:
        """The ids among ``ids`` that the index holds."""
        return ids[np.isin(ids, self.ids())]

    def _next_ids(self, count: int) -> np.ndarray:
        """Automatic ids for ``count`` new items (see :func:`next_ids`)."""
        return next_ids(self.ids(), count)

    # --- items and ids -----------------------------------------------------------------------

    def __len__(self) -> int:
        """:attr:`ntotal`, so ``len(index)`` counts the items (an empty index is falsy)."""
        return self.ntotal

    def _read_rows(self, codes, name: str) -> np.ndarray:
        return _ROW_READERS[self.row_layout](codes, self.bits, name)

    def add(self, codes, ids=None) -> None:
        """Append ``codes`` with int64 ``ids`` (default: consecutive ids after the largest one);
        an id already in the index is refused (see :meth:`upsert`)."""
        rows = self._read_rows(codes, "codes")
        self._insert(rows, self._new_ids(ids, rows.shape[0]))

    def add_batches(self, batches: Iterable[tuple], count: int) -> None:
        """Append ``count`` codes that arrive as ``(codes, ids)`` batches (ids ``None`` in every
        batch: automatic ones), in order, as one :meth:`add`: all or nothing. Each batch is copied
        into one array as it comes, one batch in memory beside it; an index that keeps a copy of its
        codes (``BMIH``) keeps that array instead of copying it again."""
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise HashIndexError(f"count must be the number of codes the batches hold (an integer >= 0), got {count!r}")
        rows, ids = _gathered(batches, int(count), self._read_rows)
        if count:
            ids = self._new_ids(ids, count)  # the gathered array dropped where the index keeps less (a range's first id)
            self._insert_gathered(rows, ids)

    def _new_ids(self, ids, count: int) -> np.ndarray:
        """The ids of ``count`` new items: ``ids`` checked (valid, none already held), or automatic ones."""
        if ids is None:  # consecutive after the largest id held: new and unique by construction
            return self._next_ids(count)
        ids = validate_ids(ids, count)
        clash = self._existing(ids) if self.ntotal else ids[:0]
        if clash.size:
            raise HashIndexError(f"ids {clash[:5].tolist()} are already in the index; use upsert() to replace them")
        return ids

    def _insert_gathered(self, rows: np.ndarray, ids: np.ndarray) -> None:
        """:meth:`_insert` of rows gathered for this add alone (no one else holds them)."""
        self._insert(rows, ids)

    def remove(self, ids) -> int:
        """Remove the items with these ids (unknown ids are ignored); return how many went."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        return self._delete(ids) if ids.size and self.ntotal else 0

    def upsert(self, codes, ids) -> None:
        """Replace the items with these ids (or add them when new); refused input changes nothing."""
        rows = self._read_rows(codes, "codes")
        ids = validate_ids(ids, rows.shape[0])
        self.remove(ids)
        self._insert(rows, ids)

    # --- queries -----------------------------------------------------------------------------

    def search(self, queries, k: int) -> SearchResult:
        """The ``k`` nearest items of each query, nearest first (ids ``-1`` where an approximate
        method found fewer)."""
        rows = self._read_rows(queries, "queries")
        return self._search(rows, validate_k(k, self.ntotal))

    def search_with_ties(self, queries, k: int) -> list[SearchResult]:
        """Each query's ``k`` nearest and every item tied with its k-th, one result per query,
        nearest first, ties in insertion order: the candidates of the second stage of a search
        (:func:`tfhash.index.refine.refined_search`). For an exact index with
        :data:`RANGE_SEARCH` (``BFlat`` finds them in one pass, :func:`tfhash.hamming.knn_ties_search`).

        Raises:
            HashIndexError: an approximate index, or one without range search; bad queries or k.
        """
        self._require(RANGE_SEARCH)
        if not self.exact:
            raise HashIndexError(f"{type(self).__name__} {self.method!r} is approximate: it cannot say which items tie with the k-th")
        rows = self._read_rows(queries, "queries")
        return self._search_with_ties(rows, validate_k(k, self.ntotal))

    def _search_with_ties(self, rows: np.ndarray, k: int) -> list[SearchResult]:
        raise NotImplementedError(f"{type(self).__name__} is exact with {RANGE_SEARCH} but does not implement _search_with_ties")

    def train(self, codes) -> None:
        """Train the search structure on ``codes`` (capability :data:`TRAIN`)."""
        self._require(TRAIN)
        self._train(self._read_rows(codes, "codes"))

    def range_search(self, queries, radius: int) -> list[SearchResult]:
        """All items within Hamming distance ``radius`` (inclusive) of each query, one result per
        query (capability :data:`RANGE_SEARCH`)."""
        self._require(RANGE_SEARCH)
        rows = self._read_rows(queries, "queries")
        radius = validate_radius(radius)
        if self.ntotal == 0:
            return [SearchResult(np.zeros(0, np.int32), np.zeros(0, np.int64)) for _ in range(rows.shape[0])]
        return self._range_search(rows, radius)

    @abc.abstractmethod
    def _search(self, rows: np.ndarray, k: int) -> SearchResult: ...

    def _train(self, rows: np.ndarray) -> None:
        raise NotImplementedError(f"{type(self).__name__} declares {TRAIN} but does not implement _train")

    def _range_search(self, rows: np.ndarray, radius: int) -> list[SearchResult]:
        raise NotImplementedError(f"{type(self).__name__} declares {RANGE_SEARCH} but does not implement _range_search")

    # --- files -------------------------------------------------------------------------------

    def save(self, path, model_version: str | None = None, signature_fingerprint: str | None = None,
             embeddings=None) -> None:  # fmt: skip
        """Persist atomically to the directory ``path`` with a manifest (see :mod:`.persistence`),
        with the items' ``embeddings`` for the second stage of a search when given
        (:mod:`tfhash.index.refine`)."""
        save_index(self, path, model_version, signature_fingerprint, embeddings)

    @abc.abstractmethod
    def write_files(self, directory) -> None:
        """Write the index's data files into ``directory`` (the manifest is written around them)."""

    @classmethod
    @abc.abstractmethod
    def read_files(cls, directory, manifest: dict, mapped: bool = False) -> HashIndex:
        """The index that :meth:`write_files` wrote into ``directory``, whose checked manifest is
        ``manifest``; ``mapped``: see :func:`tfhash.index.load_index` (ignored by types that copy
        on load)."""

    def close(self) -> None:
        """Release what the index holds outside this object (a connection); nothing by default."""
        return None


class InProcessIndex(HashIndex):
    """An index whose rows and ids live in this process, in insertion order; ties in distance are
    returned in insertion order (an item added earlier comes first) by the exact methods.

    Class attribute a subclass sets besides :class:`HashIndex`'s:
        rows_file: the ``.npy`` file that holds the rows in an index directory.
    """

    rows_file: ClassVar[str] = "codes.npy"

    def __init__(self, bits: int, method: str):
        super().__init__(bits, method)
        self._rows = empty_rows(self.row_layout, self.bits)
        self._ids = np.zeros(0, dtype=np.int64)

    @property
    def ntotal(self) -> int:
        return int(self._ids.size)

    def ids(self) -> np.ndarray:
        """External ids in insertion order."""
        return self._ids.copy()

    def _existing(self, ids: np.ndarray) -> np.ndarray:
        return ids[np.isin(ids, self._ids)]

    def _next_ids(self, count: int) -> np.ndarray:
        return next_ids(self._ids, count)

    def _insert(self, rows: np.ndarray, ids: np.ndarray) -> None:
        self._add_rows(rows)
        self._rows = np.concatenate([self._rows, rows])
        self._ids = np.concatenate([self._ids, ids])

    def _delete(self, ids: np.ndarray) -> int:
        keep = ~np.isin(self._ids, ids)
        removed = int((~keep).sum())
        if removed:
            self._rows, self._ids = self._rows[keep], self._ids[keep]
            self._items_removed()
        return removed

    # --- hooks for the search structure ------------------------------------------------------

    @abc.abstractmethod
    def _add_rows(self, rows: np.ndarray) -> None:
        """Take new rows into the search structure (called before they join ``_rows``)."""

    @abc.abstractmethod
    def _items_removed(self) -> None:
        """``_rows`` and ``_ids`` lost some items: bring the search structure in line."""

    # --- files -------------------------------------------------------------------------------

    def write_files(self, directory) -> None:
        """Write rows and ids (``.npy`` without pickle), plus :meth:`_write_structure`."""
        np.save(os.path.join(directory, self.rows_file), self._rows, allow_pickle=False)
        np.save(os.path.join(directory, IDS_FILE), self._ids, allow_pickle=False)
        self._write_structure(directory)

    @classmethod
    def read_files(cls, directory, manifest: dict, mapped: bool = False) -> HashIndex:
        index = cls.from_params(manifest["bits"], manifest["params"])
        # "c" (copy-on-write) rather than "r": the arrays stay writeable, so numba runs the kernels it
        # compiled for arrays in memory (it compiles others for read-only ones); nothing writes them,
        # so their pages stay the page cache's, one copy for every process that maps the file
        mode = "c" if mapped else None
        rows = np.load(os.path.join(directory, cls.rows_file), mmap_mode=mode, allow_pickle=False)
        ids = np.load(os.path.join(directory, IDS_FILE), mmap_mode=mode, allow_pickle=False)
        index._restore(directory, rows, ids)
        return index

    def _write_structure(self, directory) -> None:
        """Write files of the search structure that cannot be rebuilt from the rows (none by default)."""
        return None

    def _restore(self, directory, rows: np.ndarray, ids: np.ndarray) -> None:
        """Take the stored rows and ids back (by default: add them, rebuilding the structure, which
        copies mapped arrays)."""
        if rows.shape[0]:
            self.add(rows, ids)
