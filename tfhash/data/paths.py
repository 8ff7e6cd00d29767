"""Where the real datasets live.

The data root is, in order: the ``data_root`` argument, the ``TFHASH_DATA_ROOT`` environment
variable, then ``../shared/data`` next to the current directory or next to the project checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_VAR", "DataNotFoundError", "find_data_file"]


ENV_VAR = "TFHASH_DATA_ROOT"


class DataNotFoundError(FileNotFoundError):
    """A dataset file is missing; the message lists every place that was looked at."""


def _candidate_roots(data_root: str | os.PathLike | None) -> list[Path]:
    if data_root is not None:
        return [Path(data_root)]
    if os.environ.get(ENV_VAR):
        return [Path(os.environ[ENV_VAR])]
    project_root = Path(__file__).resolve().parents[2]
    candidates = [Path.cwd() / ".." / "shared" / "data", project_root / ".." / "shared" / "data"]
    unique: list[Path] = []
    for path in candidates:
        if path.resolve() not in [u.resolve() for u in unique]:
            unique.append(path)
    return unique


def find_data_file(relative: str, data_root: str | os.PathLike | None = None) -> Path:
    """Return the path of ``relative`` under the first data root that has it.

    Raises:
        DataNotFoundError: naming every full path that was tried and how to point tfhash elsewhere.
    """
    tried = []
    for root in _candidate_roots(data_root):
        path = root / relative
        if path.is_file():
            return path.resolve()
        tried.append(str(path.resolve()))
    raise DataNotFoundError(
        f"dataset file {relative!r} not found; looked for: {', '.join(tried)}. "
        f"Pass data_root=... (CLI: --data-root) or set {ENV_VAR} to the folder that holds it."
    )
