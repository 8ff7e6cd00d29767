"""What every process of a multi-process search service serves, shared through a folder."""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import time

__all__ = ["slot_path", "withdraw", "SharedStatus", "common_version", "service_status"]


#: A slot's status is stale after this many of its looks (and at least MIN_STALE_SECONDS).
STALE_LOOKS = 5
MIN_STALE_SECONDS = 10.0


def slot_path(folder: str, slot: int) -> str:
    return os.path.join(folder, f"{slot}.json")


def version_path(folder: str) -> str:
    return os.path.join(folder, "version")


def withdraw(folder: str, slot: int) -> None:
    """Forget what ``slot`` reported (its process exited)."""
    try:
        os.remove(slot_path(folder, slot))
    except FileNotFoundError:
        pass


class SharedStatus:
    """The status folder of a service of ``processes`` processes, as seen by the one in ``slot``.

    Each process (a slot, ``0 .. processes - 1``) writes ``<slot>.json`` (its pid, whether it is
    ready, the model version it serves, the time) at every look for a newer pair and every
    ``poll_seconds`` between them (a look that loads a pair may take longer), replacing the file
    atomically; every process reads all of them to answer health, readiness and GetStatus for the
    whole service. A slot whose file is missing, unreadable or older than ``stale_seconds`` counts
    as not ready: a process that died, hangs or is being restarted takes the service's readiness with
    it until it reports again. The parent (:mod:`tfhash.serving.processes`) withdraws a slot's file
    when its process exits.

    The version switch is the service's, not each process's: every process also publishes the
    versions it holds loaded (the one it serves and a newer one waiting), and the newest version that
    every process with a fresh status holds is written to the folder's ``version`` cell (8 bytes,
    memory-mapped by every process; written under a file lock by whichever process sees the agreement
    first). A process serves a waiting pair only once the cell names it, and reads the cell for each
    request while a pair waits: a request that starts after any process answered with the new
    version is answered with it by every process (:meth:`VersionedSearcher.follow
    <tfhash.serving.searcher.VersionedSearcher.follow>`).

    Args:
        folder: the folder the parent created for the statuses.
        slot: this process's slot.
        processes: how many processes the service runs.
        poll_seconds: how often every process looks for a newer pair (and publishes).
    """

    def __init__(self, folder: str, slot: int, processes: int, poll_seconds: float):
        if not 0 <= slot < processes:
            raise ValueError(f"slot {slot} is outside 0..{processes - 1}")
        self.folder, self.slot, self.processes = folder, int(slot), int(processes)
        self.stale_seconds = max(MIN_STALE_SECONDS, STALE_LOOKS * float(poll_seconds))
        self._cell: ctypes.c_int64 | None = None  # the agreed version, mapped on first use

    def publish(self, status: dict, held: list[int]) -> None:
        """Write this process's readiness, the version it serves and the versions it ``held``
        loaded (atomically: readers never see half a file)."""
        record = {"pid": os.getpid(), "time": time.time(), "ready": bool(status["ready"]),
                  "model_version": str(status.get("model_version", "")), "held": [int(v) for v in held]}  # fmt: skip
        path = slot_path(self.folder, self.slot)
        staging = f"{path}.{os.getpid()}.tmp"
        with open(staging, "w", encoding="utf-8") as out:
            json.dump(record, out)
        os.replace(staging, path)

    def gather(self) -> list[dict]:
        """Every slot's ``{"ready", "model_version", "held"}``, in slot order (not ready and
        ``held`` None where unknown or stale)."""
        now, out = time.time(), []
        for slot in range(self.processes):
            try:
                with open(slot_path(self.folder, slot), encoding="utf-8") as file:
                    record = json.load(file)
                fresh = now - float(record["time"]) <= self.stale_seconds
                held = [int(v) for v in record.get("held", ())] if fresh else None
                out.append({"ready": bool(record["ready"]) and fresh, "model_version": str(record["model_version"]), "held": held})
            except (OSError, ValueError, KeyError, TypeError):
                out.append({"ready": False, "model_version": "", "held": None})
        return out

    def _mapped_cell(self) -> ctypes.c_int64:
        if self._cell is None:
            fd = os.open(version_path(self.folder), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size < 8:
                    os.ftruncate(fd, 8)  # zeros: no version agreed yet
                # one aligned 8-byte word: every process reads and writes it whole
                self._cell = ctypes.c_int64.from_buffer(mmap.mmap(fd, 8))
            finally:
                os.close(fd)
        return self._cell

    def agreed_version(self) -> int:
        """The version the service has switched to (0: none yet); cheap enough for every request."""
        return self._mapped_cell().value

    def agree(self) -> int:
        """Switch the service to the newest version that every process with a fresh status holds
        (:func:`agreed_version`), if there is one; returns the agreed version."""
        cell = self._mapped_cell()
        with open(version_path(self.folder), "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # gather and write as one step: a late writer never undoes a newer agreement
            try:
                newest = common_version([p["held"] for p in self.gather()])
                if newest and newest != cell.value:
                    cell.value = newest
                return cell.value
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def common_version(held: list[list[int] | None]) -> int:
    """The newest version in every known ``held`` list (None: a process whose status is unknown or
    stale, left out), 0 when there is none."""
    known = [set(versions) for versions in held if versions is not None]
    common = set.intersection(*known) if known else set()
    return max(common, default=0)


def service_status(processes: list[dict]) -> dict:
    """What GetStatus says of a service whose processes report ``processes`` (each ``{"ready",
    "model_version"}``): ready only while every one is, how many are, and each one's version
    ("" where it is not ready)."""
    return {"ready": all(p["ready"] for p in processes), "processes": len(processes),
            "processes_ready": sum(p["ready"] for p in processes),
            "process_versions": [p.get("model_version", "") if p["ready"] else "" for p in processes]}  # fmt: skip
