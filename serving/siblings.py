"""What every process of a multi-process search service serves, shared through a folder.

Each process (a slot, ``0 .. processes - 1``) writes ``<slot>.json`` (its pid, whether it is
ready, the model version it serves, the time) at every look for a newer pair and every
``poll_seconds`` between them (a look that loads a pair may take longer), replacing the file
atomically; every process reads all of them to answer health, readiness and GetStatus for the
whole service. A slot whose file is missing, unreadable or older than ``stale_seconds`` counts
as not ready: a process that died, hangs or is being restarted takes the service's readiness with
it until it reports again. The parent (:mod:`tfhash.serving.processes`) withdraws a slot's file
when its process exits.
"""

from __future__ import annotations

import json
import os
import time

#: A slot's status is stale after this many of its looks (and at least MIN_STALE_SECONDS).
STALE_LOOKS = 5
MIN_STALE_SECONDS = 10.0


def slot_path(folder: str, slot: int) -> str:
    return os.path.join(folder, f"{slot}.json")


def withdraw(folder: str, slot: int) -> None:
    """Forget what ``slot`` reported (its process exited)."""
    try:
        os.remove(slot_path(folder, slot))
    except FileNotFoundError:
        pass


class Siblings:
    """The status folder of a service of ``processes`` processes, as seen by the one in ``slot``.

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

    def publish(self, status: dict) -> None:
        """Write this process's readiness and version (atomically: readers never see half a file)."""
        record = {"pid": os.getpid(), "time": time.time(), "ready": bool(status["ready"]),
                  "model_version": str(status.get("model_version", ""))}  # fmt: skip
        path = slot_path(self.folder, self.slot)
        staging = f"{path}.{os.getpid()}.tmp"
        with open(staging, "w", encoding="utf-8") as out:
            json.dump(record, out)
        os.replace(staging, path)

    def gather(self) -> list[dict]:
        """Every slot's ``{"ready", "model_version"}``, in slot order (not ready where unknown or stale)."""
        now, out = time.time(), []
        for slot in range(self.processes):
            try:
                with open(slot_path(self.folder, slot), encoding="utf-8") as file:
                    record = json.load(file)
                fresh = now - float(record["time"]) <= self.stale_seconds
                out.append({"ready": bool(record["ready"]) and fresh, "model_version": str(record["model_version"])})
            except (OSError, ValueError, KeyError, TypeError):
                out.append({"ready": False, "model_version": ""})
        return out


def service_status(processes: list[dict]) -> dict:
    """What GetStatus says of a service whose processes report ``processes`` (each ``{"ready",
    "model_version"}``): ready only while every one is, how many are, and each one's version
    ("" where it is not ready)."""
    return {"ready": all(p["ready"] for p in processes), "processes": len(processes),
            "processes_ready": sum(p["ready"] for p in processes),
            "process_versions": [p.get("model_version", "") if p["ready"] else "" for p in processes]}  # fmt: skip
