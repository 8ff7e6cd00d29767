"""The search service's core: a model version paired with the index that version built, swapped
atomically for a newer pair, and the request checks and search that both fronts (gRPC, REST) use.

Pairing rule: version V is served only when the encoder serves V (the SavedModel folder
``<model_base_dir>/V`` in process, or ``AVAILABLE`` on TF Serving) and ``<index_base_dir>/V/<kind>``
is an index whose manifest names model version V, whose checksums verify, whose code width is the
model's, and whose recorded signature fingerprint (when both sides have one) is the model's. A
request reads the active pair once, so a swap never mixes two versions inside one answer, and the
old pair serves the requests that started on it.

Queries: serialized examples or raw features (encoded by the pair's model), or codes already
computed by the client (the caller then pins ``model_version`` to be sure they came from the
model whose index answers). Codes are binarised with sign (sign(0) = +1) and searched in Hamming
space, also on a ScaNN index (dot product of +-1 codes), so every index kind answers in the same
units.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tfhash.serving.encoders import Encoder
from tfhash.serving.errors import invalid, not_found, unavailable

from tfhash.codes import as_packed, pack_codes, sign_codes
from tfhash.index import HashIndex, IndexError_, IndexFormatError, load_index, read_manifest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedPair:
    """A model version and the index it built."""

    version: int
    encoder: Encoder
    index: HashIndex
    index_path: str
    fingerprint: str | None


@dataclass(frozen=True)
class Query:
    """One request's queries: exactly one of ``examples`` (list of bytes), ``features`` (float
    array, batch first) or ``codes`` (packed uint8 (n, K/8) or +-1 (n, K))."""

    examples: list | None = None
    features: np.ndarray | None = None
    codes: np.ndarray | None = None

    @property
    def size(self) -> int:
        given = [x for x in (self.examples, self.features, self.codes) if x is not None]
        if len(given) != 1:
            raise invalid("a request needs exactly one of examples, features or codes")
        return len(given[0])


@dataclass(frozen=True)
class Limits:
    """Request limits: queries per request and neighbours per query."""

    max_batch: int = 256
    max_k: int = 1000


DEFAULT_LIMITS = Limits()


@dataclass
class Neighbours:
    ids: np.ndarray
    distances: np.ndarray


class VersionedSearcher:
    """Serves the newest complete model/index pair; :meth:`refresh` looks for a newer one.

    Args:
        index_base_dir: holds ``<version>/<kind>/`` index directories (the IndexBuilder's layout).
        kind: the index kind to serve (its folder name, e.g. ``"BFlat"``).
        available_versions: returns the model versions the encoder side serves now.
        make_encoder: builds the encoder of one version.
        fingerprint_of: the SavedModel fingerprint of a version, or None when it cannot be read
            (a remote model whose files are not visible here).
    """

    def __init__(self, index_base_dir: str, kind: str, available_versions: Callable[[], list[int]],
                 make_encoder: Callable[[int], Encoder], fingerprint_of: Callable[[int], str | None] = lambda v: None,
                 limits: Limits = DEFAULT_LIMITS):  # fmt: skip
        self.index_base_dir, self.kind, self.limits = index_base_dir, kind, limits
        self._available_versions, self._make_encoder, self._fingerprint_of = available_versions, make_encoder, fingerprint_of
        self._active: ServedPair | None = None
        self._refresh_lock = threading.Lock()
        self._rejected: dict[int, float] = {}  # version -> manifest mtime of a pair that failed to load

    @property
    def active(self) -> ServedPair | None:
        return self._active

    def index_path(self, version: int) -> str:
        return os.path.join(self.index_base_dir, str(version), self.kind)

    def refresh(self) -> bool:
        """Swap to the newest version newer than the active one whose pair loads; True if swapped."""
        with self._refresh_lock:
            current = self._active.version if self._active else 0
            for version in sorted((v for v in self._available_versions() if v > current), reverse=True):
                pair = self._try_pair(version)
                if pair is not None:
                    self._active = pair
                    logger.info("serving model version %d with index %s", version, pair.index_path)
                    return True
            return False

    def _try_pair(self, version: int) -> ServedPair | None:
        path = self.index_path(version)
        manifest_file = os.path.join(path, "manifest.json")
        if not os.path.isfile(manifest_file):
            return None  # the index of this version is not built yet
        stamp = os.stat(manifest_file).st_mtime
        if self._rejected.get(version) == stamp:
            return None
        try:
            pair = self._load_pair(version, path)
        except Exception as err:  # a broken pair is reported and skipped, never served
            logger.error("model version %d is not served: %s", version, err)
            self._rejected[version] = stamp
            return None
        self._rejected.pop(version, None)
        return pair

    def _load_pair(self, version: int, path: str) -> ServedPair:
        manifest = read_manifest(path)
        index = load_index(path, expected_model_version=str(version))
        encoder = self._make_encoder(version)
        if encoder.bits != index.bits:
            raise IndexFormatError(f"{path}: the index holds {index.bits}-bit codes, model version {version} makes {encoder.bits}")
        recorded, actual = manifest["model"].get("signature_fingerprint"), self._fingerprint_of(version)
        if recorded and actual and recorded != actual:
            raise IndexFormatError(f"{path}: built by a SavedModel with fingerprint {recorded}, version {version} has {actual}")
        k = min(self.limits.max_k, index.ntotal)
        if k:  # build lazy structures (ScaNN) for the largest k now, not under load
            index.search(np.ones((1, index.bits), dtype=np.int8), k)
        return ServedPair(version, encoder, index, path, actual or recorded)

    def pair_for(self, model_version: str = "") -> ServedPair:
        """The active pair, checked against a pinned version ("" = any)."""
        pair = self._active
        if pair is None:
            raise unavailable("no model version with its index is ready yet")
        if model_version and model_version != str(pair.version):
            raise not_found(f"model version {model_version} is not served; this service serves version {pair.version}")
        return pair

    def search(self, query: Query, k: int, radius: int | None = None, model_version: str = "",
               timeout: float | None = None) -> tuple[ServedPair, list[Neighbours]]:  # fmt: skip
        """Encode (if needed) and search with one pair.

        Raises:
            ServingError: INVALID_ARGUMENT for an empty or oversized batch, k outside 1..max_k or
                above the database size, a negative radius, malformed inputs or codes of the wrong
                width; NOT_FOUND for a pinned version that is not served; UNAVAILABLE when no pair
                is ready.
        """
        n = query.size
        if n == 0:
            raise invalid("the request has no queries")
        if n > self.limits.max_batch:
            raise invalid(f"{n} queries in one request; the limit is {self.limits.max_batch}")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= self.limits.max_k:
            raise invalid(f"k must be an integer in 1..{self.limits.max_k}, got {k!r}")
        if radius is not None and radius < 0:
            raise invalid(f"radius must be >= 0, got {radius}")
        pair = self.pair_for(model_version)
        if k > pair.index.ntotal:
            raise invalid(f"k = {k} is larger than the {pair.index.ntotal} items in the index")
        packed = self._packed_codes(pair, query, timeout)
        try:
            return pair, self._neighbours(pair.index, packed, int(k), radius)
        except IndexError_ as err:
            raise invalid(str(err)) from err

    def _packed_codes(self, pair: ServedPair, query: Query, timeout: float | None) -> np.ndarray:
        if query.examples is not None:
            return pack_codes(sign_codes(pair.encoder.encode_examples(query.examples, timeout)))
        if query.features is not None:
            return pack_codes(sign_codes(pair.encoder.encode_features(query.features, timeout)))
        try:
            packed = as_packed(query.codes, "codes")  # +-1 (any numeric dtype) or packed uint8
        except (ValueError, TypeError) as err:
            raise invalid(str(err)) from err
        if packed.shape[1] * 8 != pair.index.bits:
            raise invalid(f"codes have {packed.shape[1] * 8} bits; the index holds {pair.index.bits}-bit codes "
                          f"(packed uint8 (n, {pair.index.bits // 8}) or +-1 (n, {pair.index.bits}))")  # fmt: skip
        return packed

    @staticmethod
    def _neighbours(index: HashIndex, packed: np.ndarray, k: int, radius: int | None) -> list[Neighbours]:
        if radius is not None and hasattr(index, "range_search"):
            return [Neighbours(r.ids[:k], r.distances[:k].astype(np.float32)) for r in index.range_search(packed, radius)]
        result = index.search(packed, k)  # every index kind takes packed codes
        out = []
        for ids, distances in zip(result.ids, np.asarray(result.distances, dtype=np.float32), strict=True):
            keep = ids >= 0 if radius is None else (ids >= 0) & (distances <= radius)
            out.append(Neighbours(ids[keep], distances[keep]))
        return out

    def status(self) -> dict:
        pair = self._active
        if pair is None:
            return {"ready": False}
        return {"ready": True, "model_version": str(pair.version), "index_kind": pair.index.kind,
                "count": pair.index.ntotal, "bits": pair.index.bits, "signature_fingerprint": pair.fingerprint or "",
                "encoder": pair.encoder.describe(), "index_path": pair.index_path}  # fmt: skip
