"""Model versions under a TF Serving model base directory, TF Serving's version policies, whether
a version pairs with a published index, and when to retry a version that failed to load.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tfhash import storage
from tfhash.artifacts import index_versions_dir, signature_fingerprint
from tfhash.index import IndexFormatError, check_model, read_manifest, verify_files

__all__ = ["select_versions", "tree_stamp", "Retries", "model_fingerprint", "check_fingerprint", "pair_published"]


def select_versions(available: list[int], policy) -> list[int]:
    """The versions a ``ServableVersionPolicy`` (models.config ``model_version_policy``) serves.

    ``latest {num_versions: N}`` (TF Serving's default, N = 1), ``all {}``, or ``specific {versions:
    ...}`` (only those that exist).
    """
    available = sorted(available)
    choice = policy.WhichOneof("policy_choice") if policy is not None else None
    if choice == "all":
        return available
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in available if v in wanted]
    count = policy.latest.num_versions if choice == "latest" and policy.latest.num_versions > 0 else 1
    return available[-count:]


def tree_stamp(*paths: str | None) -> tuple:
    """What changes when a file under ``paths`` (folders, files or URIs) is added, removed, resized
    or rewritten: the relative path, size and modification time of every file (a missing path holds
    none; :func:`tfhash.storage.files_under`)."""
    return tuple(sorted((root, *entry) for root, path in enumerate(paths) if path for entry in storage.files_under(path)))


@dataclass
class _Failure:
    stamp: tuple
    count: int
    retry_at: float
    error: str


class Retries:
    """Failed loads, and when each may be tried again: at once when its files changed (a copy
    that finished), otherwise after ``first_delay`` seconds, doubling up to ``max_delay`` (a fault
    that may clear by itself, such as a model server still loading the version).

    Publishing a version atomically means writing it elsewhere on the same file system and renaming
    the finished folder into place (``<base>/.tmp-7`` -> ``<base>/7``). A version copied file by file
    is tolerated: a load that fails on the incomplete copy is retried as soon as any of its files
    changes (:func:`tree_stamp`), so the finished copy is loaded at the next poll.
    """

    def __init__(self, first_delay: float = 1.0, max_delay: float = 60.0, clock=time.monotonic):
        if not 0 < first_delay <= max_delay:
            raise ValueError(f"need 0 < first_delay <= max_delay, got {first_delay}, {max_delay}")
        self.first_delay, self.max_delay, self._clock = float(first_delay), float(max_delay), clock
        self._failures: dict = {}

    def due(self, key, stamp: tuple) -> bool:
        """Whether ``key``, whose files now have ``stamp``, should be tried (again)."""
        failure = self._failures.get(key)
        return failure is None or failure.stamp != stamp or self._clock() >= failure.retry_at

    def failed(self, key, stamp: tuple, error: str) -> None:
        previous = self._failures.get(key)
        count = previous.count + 1 if previous is not None and previous.stamp == stamp else 1
        delay = min(self.first_delay * 2 ** (count - 1), self.max_delay)
        self._failures[key] = _Failure(stamp, count, self._clock() + delay, error)

    def succeeded(self, key) -> None:
        self._failures.pop(key, None)

    def errors(self) -> dict:
        """key -> the error of its last failed attempt."""
        return {key: failure.error for key, failure in self._failures.items()}


def model_fingerprint(model_dir: str | None) -> str | None:
    """The SavedModel fingerprint of a version folder (None when the folder is not visible here)."""
    if model_dir is None:
        return None
    return signature_fingerprint(model_dir)


def check_fingerprint(index_path: str, manifest: dict, model_dir: str | None) -> str | None:
    """The pair's fingerprint; IndexFormatError (from :func:`tfhash.index.persistence.check_model`,
    the library's check) when the index records another SavedModel's. Compared only when both
    sides have one: an index that records none, or a model folder not visible here, passes."""
    recorded, actual = manifest["model"].get("signature_fingerprint"), model_fingerprint(model_dir)
    if recorded and actual:
        check_model(index_path, manifest, expected_signature_fingerprint=actual)
    return actual or recorded


def pair_published(index_base_dir: str, version: int, model_dir: str | None) -> bool:
    """Whether some index under ``<index_base_dir>/<version>/`` pairs with the model version: its
    manifest names the version, its checksums verify and its fingerprint is the SavedModel's (what
    the search service checks before it serves a pair, short of loading it)."""
    folder = index_versions_dir(index_base_dir, version)
    for kind in storage.listdir(folder) if storage.isdir(folder) else []:
        path = storage.join(folder, kind)
        try:
            manifest = read_manifest(path)
            if manifest["model"].get("version") != str(version):
                continue
            verify_files(path, manifest)
            check_fingerprint(path, manifest, model_dir)
            return True
        except (IndexFormatError, OSError, ValueError):  # not (yet) a pair: incomplete, corrupt or another model's
            continue
    return False
