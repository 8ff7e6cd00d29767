"""The search service's core: a model version paired with the index that version built, swapped
atomically for a newer pair, and the search that both fronts (gRPC, REST) use."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tfhash.serving.encoders import Encoder
from tfhash.serving.errors import invalid, not_found, quoted_value, unavailable
from tfhash.serving.requests import DEFAULT_LIMITS, Limits, Query
from tfhash.serving.versions import Retries, check_fingerprint, tree_stamp

from tfhash import storage
from tfhash.artifacts import Item, index_dir
from tfhash.codes import as_packed
from tfhash.index import (
    RANGE_SEARCH,
    Embeddings,
    HashIndex,
    HashIndexError,
    IndexFormatError,
    IndexUnavailableError,
    load_embeddings,
    load_index,
    read_manifest,
    refined_search,
)

__all__ = ["ServedPair", "Neighbours", "VersionedSearcher"]


logger = logging.getLogger(__name__)

#: The answer's item for an id the items file does not name.
UNKNOWN_ITEM = Item("", ())


@dataclass(frozen=True)
class ServedPair:
    """A model version and the index it built (with its items' embeddings when it stores them);
    ``stamp`` is the files' state when it loaded."""

    version: int
    encoder: Encoder
    index: HashIndex
    index_path: str
    fingerprint: str | None
    stamp: tuple = ()
    embeddings: Embeddings | None = None

    def refines(self, query: Query) -> bool:
        """Whether ``query`` is answered by the second stage: the index stores embeddings, the
        query did not turn it off, and it is encoded here (codes carry no embedding)."""
        return self.embeddings is not None and bool(query.refine) and query.form != "codes"


@dataclass
class Neighbours:
    ids: np.ndarray
    distances: np.ndarray
    items: list[Item] | None = None  # each neighbour's file and classes, when the service knows them
    refined: bool = False  # ordered by the second stage (tfhash.index.refine)


class VersionedSearcher:
    """Serves the newest complete model/index pair; :meth:`refresh` converges on it.

    Pairing rule: version V is served only when the encoder serves V (the SavedModel folder
    ``<model_base_dir>/V`` in process, or ``AVAILABLE`` on TF Serving) and ``<index_base_dir>/V/<kind>``
    is an index whose manifest names model version V, whose checksums verify, whose code width is the
    model's, and whose recorded signature fingerprint (when both sides have one) is the model's. A
    request reads the active pair once, so a swap never mixes two versions inside one answer, and the
    old pair serves the requests that started on it.

    Convergence (:meth:`VersionedSearcher.refresh`, called by the service's watcher every poll):

    * the newest available version whose pair loads is served; a newer one replaces it as soon as
      its pair loads;
    * a pair that fails to load (a copy still in progress, a corrupt file, a model server still
      loading) is retried at the next poll once any of its files changed, else with a doubling
      delay (:class:`tfhash.serving.versions.Retries`), so a version copied file by file is served
      at the first poll after the copy completes;
    * when the encoder side withdraws the active version (its folder removed, or TF Serving no longer
      reports it AVAILABLE), the newest other version that pairs takes over, even an older one; with
      none, nothing is served (UNAVAILABLE, health NOT_SERVING) until one pairs again;
    * one process of several (:meth:`VersionedSearcher.follow`): a newer pair, once loaded, waits
      until every process of the service holds it, and then all switch together
      (:mod:`tfhash.serving.shared_status`);
    * when the encoder side cannot be asked (TF Serving unreachable) the pair is kept but reported
      not ready, since queries that need encoding cannot be answered.

    Queries: serialized examples or raw features (encoded by the pair's model), or codes already
    computed by the client (the caller then pins ``model_version`` to be sure they came from the
    model whose index answers). An index version that stores its items' embeddings answers encoded
    queries with the second stage (:mod:`tfhash.index.refine`: the Hamming candidates ordered by
    cosine similarity of the continuous codes) unless the query turns it off. Codes are binarised with sign (sign(0) = +1) and searched in Hamming
    space, also on a ScaNN index (dot product of +-1 codes), so every index kind answers in the same
    units. A radius filters the k nearest neighbours (it never widens the search), so a request's
    cost is bounded by its queries and k whatever the radius.

    Items: given the exported data's ``items.csv`` (:func:`tfhash.artifacts.read_items`), every
    neighbour is answered with its source file and class names too (an id the file does not name gets
    an empty path and no labels).

    Args:
        index_base_dir: holds ``<version>/<kind>/`` index directories (the IndexBuilder's layout).
        kind: the index kind to serve (its folder name, e.g. ``"BFlat"``).
        available_versions: the model versions the encoder side serves now, or None when that
            cannot be known (TF Serving unreachable).
        make_encoder: builds the encoder of one version.
        model_dir_of: the SavedModel folder of a version, or None where it is not visible here (a
            remote model); used for the fingerprint check and to notice a copy that completed.
        retries: when to retry a pair that failed to load.
        items: ``{id: Item}`` of the indexed data (its ``items.csv``), to name every answer.
    """

    def __init__(self, index_base_dir: str, kind: str, available_versions: Callable[[], list[int] | None],
                 make_encoder: Callable[[int], Encoder], model_dir_of: Callable[[int], str | None] = lambda v: None,
                 limits: Limits = DEFAULT_LIMITS, retries: Retries | None = None, items: dict[int, Item] | None = None):  # fmt: skip
        self.index_base_dir, self.kind, self.limits, self.items = index_base_dir, kind, limits, items
        self._available_versions, self._make_encoder, self._model_dir_of = available_versions, make_encoder, model_dir_of
        self._active: ServedPair | None = None
        self._waiting: ServedPair | None = None  # newer, loaded, until the service agrees on it (follow)
        self._agreed_version: Callable[[], int] | None = None
        self._swap_lock = threading.Lock()
        self._parked: ServedPair | None = None  # a withdrawn pair, reused if its version returns unchanged
        self._reachable = True
        self._refresh_lock = threading.Lock()
        self.retries = retries or Retries()

    @property
    def active(self) -> ServedPair | None:
        return self._active

    @property
    def ready(self) -> bool:
        """A pair is loaded and its encoder side answered the last look."""
        return self._active is not None and self._reachable

    def index_path(self, version: int) -> str:
        return index_dir(self.index_base_dir, version, self.kind)

    def follow(self, agreed_version: Callable[[], int]) -> None:
        """Serve a newer pair only once ``agreed_version()`` names it: this is one process of a
        service whose processes switch together (:mod:`tfhash.serving.shared_status`). Until then the
        newer pair waits loaded (:meth:`held_versions`) and the served one keeps answering. A
        withdrawn version is still left at once, and a process with nothing to serve serves the
        newest pair it loads."""
        self._agreed_version = agreed_version

    def held_versions(self) -> list[int]:
        """The versions whose pairs are loaded: the one served and a newer one waiting."""
        return sorted(pair.version for pair in (self._active, self._waiting) if pair is not None)

    def _current(self) -> ServedPair | None:
        """The pair to answer with: the waiting pair once the service agreed on it, else the active one."""
        waiting = self._waiting
        if waiting is not None and self._agreed_version is not None and self._agreed_version() == waiting.version:
            with self._swap_lock:
                if self._waiting is waiting:
                    self._active, self._waiting = waiting, None
                    logger.info("serving model version %d with index %s (the service switched)", waiting.version, waiting.index_path)
        return self._active

    def refresh(self) -> bool:
        """Converge on the newest available version whose pair loads (the class docstring); True if
        the served pair changed (or, following the service, a newer pair now waits)."""
        with self._refresh_lock:
            available = self._available_versions()
            self._reachable = available is not None
            if available is None:
                return False
            self._current()
            changed = False
            with self._swap_lock:
                if self._waiting is not None and self._waiting.version not in available:
                    self._waiting = None
                active = self._active
                if active is not None and active.version not in available:
                    logger.warning("model version %d was withdrawn by the encoder side; looking for another pair", active.version)
                    # a waiting pair takes over at once; else the withdrawn one is kept in case it returns
                    self._active, self._parked, changed = self._waiting, active if self._waiting is None else None, True
                    self._waiting = None
            newest = max(self.held_versions(), default=0)
            for version in sorted(available, reverse=True):
                if version <= newest:
                    break
                pair = self._try_pair(version)
                if pair is not None:
                    with self._swap_lock:
                        if self._active is None or self._agreed_version is None:
                            self._active, self._waiting = pair, None
                            logger.info("serving model version %d with index %s", version, pair.index_path)
                        else:
                            self._waiting = pair
                            logger.info("model version %d loaded; it is served once every process of the service holds it", version)
                    if self._parked is not None and self._parked.version != version:
                        self._parked = None  # another pair serves: free the withdrawn one
                    return True
            return changed

    def _try_pair(self, version: int) -> ServedPair | None:
        path = self.index_path(version)
        if not storage.isfile(storage.join(path, "manifest.json")):
            return None  # the index of this version is not built (or not published) yet
        stamp = tree_stamp(path, self._model_dir_of(version))
        parked = self._parked
        if parked is not None and parked.version == version and parked.stamp == stamp:
            self._parked = None
            return parked
        if not self.retries.due(version, stamp):
            return None
        try:
            pair = self._load_pair(version, path, stamp)
        except Exception as err:  # a broken or incomplete pair is reported and retried, never served
            # the text only: a kept exception would hold its frames, and with them the pair they held
            error = f"{type(err).__name__}: {err}"
            logger.error("model version %d is not served (yet): %s", version, error)
            self.retries.failed(version, stamp, error)
            return None
        self.retries.succeeded(version)
        return pair

    def _load_pair(self, version: int, path: str, stamp: tuple) -> ServedPair:
        manifest = read_manifest(path)
        # a flat index's codes are mapped: the processes of a service share one copy
        index = load_index(path, expected_model_version=str(version), mapped=True)
        embeddings = load_embeddings(path, mapped=True, manifest=manifest)  # its files verified by load_index
        encoder = self._make_encoder(version)
        if encoder.bits != index.bits:
            raise IndexFormatError(f"{path}: the index holds {index.bits}-bit codes, model version {version} makes {encoder.bits}")
        fingerprint = check_fingerprint(path, manifest, self._model_dir_of(version))
        k = min(self.limits.max_k, index.ntotal)
        if k:  # build lazy structures (ScaNN) for the largest k, and compile the kernels, now, not under load
            probe = np.ones((1, index.bits), dtype=np.int8)
            index.search(probe, k)
            if index.supports(RANGE_SEARCH):
                index.range_search(probe, 0)
        return ServedPair(version, encoder, index, path, fingerprint, stamp, embeddings)

    def pair_for(self, model_version: str = "") -> ServedPair:
        """The pair to answer with, checked against a pinned version ("" = any)."""
        pair = self._current()
        if pair is None:
            raise unavailable("no model version with its index is ready")
        if model_version and model_version != str(pair.version):
            raise not_found(f"model version {quoted_value(model_version, 40)} is not served; this service serves version {pair.version}")
        return pair

    def check(self, query: Query) -> None:
        """Refuse a query over the limits: an empty or oversized batch, k outside 1..max_k, a
        negative radius (INVALID_ARGUMENT)."""
        n, k, radius = query.size, query.k, query.radius
        if n == 0:
            raise invalid("the request has no queries")
        if n > self.limits.max_batch:
            raise invalid(f"{n} queries in one request; the limit is {self.limits.max_batch}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= self.limits.max_k:
            raise invalid(f"k must be an integer in 1..{self.limits.max_k}, got {k!r}"[:200])
        if radius is not None and (isinstance(radius, bool) or not isinstance(radius, (int, np.integer)) or radius < 0):
            raise invalid(f"radius must be an integer >= 0, got {radius!r}"[:200])

    def search(self, query: Query, timeout: float | None = None) -> tuple[ServedPair, list[Neighbours]]:
        """Encode (if needed) and search with one pair: the ``query.k`` nearest neighbours of each
        query, only those within Hamming distance ``query.radius`` when it is given (:meth:`check`,
        then :meth:`answer`).

        Raises:
            ServingError: INVALID_ARGUMENT for an empty or oversized batch, k outside 1..max_k or
                above the database size, a negative radius, inputs the model does not take or
                codes of the wrong width; NOT_FOUND for a pinned version that is not served;
                UNAVAILABLE when no pair is ready, or when the index's store (a Milvus server)
                does not answer; DEADLINE_EXCEEDED when encoding did not finish within ``timeout``.
        """
        self.check(query)
        return self.answer(query, timeout)

    def answer(self, query: Query, timeout: float | None = None) -> tuple[ServedPair, list[Neighbours]]:
        """:meth:`search` of a query that :meth:`check` passed: what depends on the pair is checked
        here (the pinned version, k against the database, the codes' width, the model's input)."""
        pair = self.pair_for(query.model_version)
        k = int(query.k)
        if k > pair.index.ntotal:
            raise invalid(f"k = {k} is larger than the {pair.index.ntotal} items in the index")
        packed, continuous = self._encoded(pair, query, timeout)
        radius = None if query.radius is None else min(int(query.radius), pair.index.bits)  # any radius >= K keeps all
        try:
            if pair.refines(query):
                found, refined = refined_search(pair.index, pair.embeddings, continuous, k), True
            else:
                found, refined = pair.index.search(packed, k), False
            return pair, self._neighbours(found, radius, refined)
        except HashIndexError as err:
            raise invalid(str(err)) from err
        except IndexUnavailableError as err:  # the index's store (a Milvus server) failed: retry later
            logger.error("model version %d: %s", pair.version, err)  # the details name hosts and paths: logged only
            raise unavailable(f"the index of model version {pair.version} did not answer (its store is unreachable); "
                              "retry later") from err  # fmt: skip

    def _encoded(self, pair: ServedPair, query: Query, timeout: float | None) -> tuple[np.ndarray, np.ndarray | None]:
        """``(packed codes, continuous codes)`` of the queries (None for the latter of codes)."""
        if query.examples is not None:
            return pair.encoder.encode_examples(query.examples, timeout)
        if query.features is not None:
            return pair.encoder.encode_features(query.features, timeout)
        try:
            packed = as_packed(query.codes, "codes")  # +-1 (any numeric dtype) or packed uint8
        except (ValueError, TypeError) as err:
            raise invalid(str(err)) from err
        if packed.shape[1] * 8 != pair.index.bits:
            raise invalid(f"codes have {packed.shape[1] * 8} bits; the index holds {pair.index.bits}-bit codes "
                          f"(packed uint8 (n, {pair.index.bits // 8}) or +-1 (n, {pair.index.bits}))")  # fmt: skip
        return packed, None

    def _neighbours(self, found, radius: int | None, refined: bool) -> list[Neighbours]:
        out = []
        for distances, ids in zip(*found, strict=True):  # a SearchResult's order
            distances = np.asarray(distances, dtype=np.float32)
            keep = ids >= 0 if radius is None else (ids >= 0) & (distances <= radius)
            items = None if self.items is None else [self.items.get(int(i), UNKNOWN_ITEM) for i in ids[keep]]
            out.append(Neighbours(ids[keep], distances[keep], items, refined))
        return out

    def status(self) -> dict:
        """What is served, without file-system paths (the index as ``<version>/<kind>``)."""
        pair = self._current()
        if pair is None:
            return {"ready": False}
        return {"ready": self.ready, "model_version": str(pair.version), "index_kind": pair.index.format_tag,
                "count": pair.index.ntotal, "bits": pair.index.bits, "signature_fingerprint": pair.fingerprint or "",
                "encoder": pair.encoder.describe(), "index_path": f"{pair.version}/{self.kind}",
                "embeddings": pair.embeddings is not None}  # fmt: skip
