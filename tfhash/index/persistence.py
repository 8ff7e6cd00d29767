"""Index directories: data files plus ``manifest.json``, written atomically, verified on load.

Manifest (format version 1)::

    {"format_version": 1, "kind": "binary-flat", "bits": 64, "count": 69000, "id_dtype": "int64",
     "params": {...}, "model": {"version": "3", "signature_fingerprint": "..."},
     "files": {"codes.npy": "<sha256>", ...}, "tfhash_version": "0.1.0", "created": "..."}

No pickle anywhere: arrays are ``.npy`` with ``allow_pickle=False``, FAISS and ScaNN write their own
formats. A save writes into a temporary sibling directory and renames it into place; an existing
index at the path is replaced only after the new one is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from tfhash._version import __version__

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


class IndexFormatError(ValueError):
    """The index directory is corrupt, incomplete or of an unknown format version."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _registry() -> dict:
    from tfhash.index.binary import BinaryIndex
    from tfhash.index.scann_index import ScannIndex

    return {"binary": BinaryIndex, "scann": ScannIndex}


def _family(kind: str) -> str:
    return kind.split("-", 1)[0]


def save_index(index, path, model_version: str | None = None, signature_fingerprint: str | None = None) -> Path:
    """Write ``index`` to the directory ``path`` atomically (see module docstring)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        index.write_files(staging)
        files = {
            p.relative_to(staging).as_posix(): _sha256(p) for p in sorted(staging.rglob("*")) if p.is_file()
        }
        manifest = {
            "format_version": FORMAT_VERSION,
            "kind": index.kind,
            "bits": index.bits,
            "count": index.ntotal,
            "id_dtype": "int64",
            "exact": index.exact,
            "params": index.params(),
            "model": {"version": model_version, "signature_fingerprint": signature_fingerprint},
            "files": files,
            "tfhash_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if target.exists():
            retired = target.with_name(f".{target.name}.old-{os.getpid()}-{time.time_ns()}")
            os.rename(target, retired)
            os.rename(staging, target)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def read_manifest(path) -> dict:
    """Parse and check the manifest of the index directory ``path``.

    Raises:
        IndexFormatError: missing or unparsable manifest, unknown format version or kind.
    """
    manifest_path = Path(path) / MANIFEST
    if not manifest_path.is_file():
        raise IndexFormatError(f"{path}: no {MANIFEST}; not a tfhash index directory")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise IndexFormatError(f"{manifest_path}: not valid JSON ({err})") from err
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise IndexFormatError(
            f"{path}: index format version {version!r} is not supported (this tfhash reads version {FORMAT_VERSION})"
        )
    for key in ("kind", "bits", "count", "files", "params"):
        if key not in manifest:
            raise IndexFormatError(f"{manifest_path}: missing field {key!r}")
    if _family(manifest["kind"]) not in _registry():
        raise IndexFormatError(f"{path}: unknown index kind {manifest['kind']!r}")
    return manifest


def verify_files(path, manifest: dict) -> None:
    """Check that every file named by the manifest exists with the recorded sha256."""
    for name, digest in manifest["files"].items():
        file_path = Path(path) / name
        if not file_path.is_file():
            raise IndexFormatError(f"{path}: file {name} named by the manifest is missing")
        if _sha256(file_path) != digest:
            raise IndexFormatError(f"{path}: checksum mismatch for {name}: the file is corrupt or was modified")


def load_index(path, expected_model_version: str | None = None):
    """Load an index directory after verifying its manifest and checksums.

    Args:
        expected_model_version: when given, refuse an index built from another model version.

    Raises:
        IndexFormatError: corrupt files, unknown format, or a model version mismatch.
    """
    manifest = read_manifest(path)
    if expected_model_version is not None and manifest["model"].get("version") != str(expected_model_version):
        raise IndexFormatError(
            f"{path}: index was built for model version {manifest['model'].get('version')!r}, "
            f"not {expected_model_version!r}"
        )
    verify_files(path, manifest)
    cls = _registry()[_family(manifest["kind"])]
    index = cls.read_files(path, manifest["bits"], manifest["params"])
    if index.ntotal != manifest["count"]:
        raise IndexFormatError(f"{path}: manifest says {manifest['count']} items, files hold {index.ntotal}")
    return index
