"""PyTorch state dicts read without PyTorch, as untrusted input.

A ``.pth`` file is a pickle, and unpickling runs whatever callables the stream names. This reader
admits only what a state dict is made of (tensors and the ordered dicts that hold them) and refuses
any other global with :class:`CheckpointError` naming it, before anything is called.
:func:`read_state_dict` reads both of ``torch.save``'s formats.
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import struct
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["CheckpointError", "read_state_dict", "STORAGE_DTYPES"]

#: The first pickle of a legacy-format file, and the protocol version that follows it.
LEGACY_MAGIC, LEGACY_PROTOCOL = 0x1950A86A20F9469CFC6C, 1001
#: ``torch.<name>`` storage tags and the element type of their bytes (bfloat16: see :func:`_as_array`).
STORAGE_DTYPES = {
    "FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2", "BFloat16Storage": "bfloat16",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "?",
}  # fmt: skip


class CheckpointError(ValueError):
    """A file that is not a PyTorch state dict this reader admits: a pickle naming anything but
    tensors and ordered dicts, a truncated or inconsistent file, or another kind of file."""


class _Sealed:
    """A stand-in the pickle may not change: BUILD (``__setstate__``) is refused."""

    def __setstate__(self, state):
        raise CheckpointError(f"the checkpoint's pickle sets the state of a {type(self).__name__.strip('_')} record; refused")


@dataclass(frozen=True)
class _StorageType(_Sealed):
    """Stand-in for ``torch.<name>``: a type tag, not callable."""

    name: str


@dataclass(frozen=True)
class _StorageRef(_Sealed):
    """A storage named by a persistent id: its key, type and element count."""

    key: str
    dtype: str
    numel: int


@dataclass(frozen=True)
class _Tensor(_Sealed):
    """A tensor as ``_rebuild_tensor_v2`` describes it, made an array once the storages are read."""

    storage: _StorageRef
    offset: int
    shape: tuple
    stride: tuple


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None):
    """Stand-in for ``torch._utils._rebuild_tensor_v2``: records the view, checks its arguments."""
    shaped = isinstance(size, tuple | list) and isinstance(stride, tuple | list) and len(size) == len(stride)
    ints = (storage_offset, *size, *stride) if shaped else ()
    if not isinstance(storage, _StorageRef) or not shaped or not all(type(v) is int and 0 <= v < 2**62 for v in ints):
        raise CheckpointError(f"a tensor record with unexpected arguments (storage {type(storage).__name__}, "
                              f"offset {storage_offset!r}, size {size!r}, stride {stride!r})")  # fmt: skip
    elements = math.prod(size)
    last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) if elements else storage_offset - 1
    if last >= storage.numel or storage_offset > storage.numel or elements > storage.numel:
        raise CheckpointError(f"a tensor of size {tuple(size)} at offset {storage_offset} reaches past its storage "
                              f"of {storage.numel} elements")  # fmt: skip
    return _Tensor(storage, storage_offset, tuple(size), tuple(stride))


_ADMITTED = {("collections", "OrderedDict"): collections.OrderedDict, ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2}


class _Unpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`_ADMITTED` globals and storage tags.

    The admitted pickle globals are ``collections.OrderedDict``, ``torch._utils._rebuild_tensor_v2``
    and the ``torch.<Type>Storage`` tags, each replaced by a harmless stand-in; any other global is
    refused with :class:`CheckpointError` naming it, before anything is called.
    """

    def __init__(self, stream):
        super().__init__(stream)
        self.storages: dict[str, _StorageRef] = {}

    def find_class(self, module, name):
        if (module, name) in _ADMITTED:
            return _ADMITTED[module, name]
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        raise CheckpointError(f"the checkpoint's pickle names {module}.{name}, which a state dict does not hold; "
                              "refused without running it (only tensors and ordered dicts are read)")  # fmt: skip

    def persistent_load(self, pid):
        # legacy: ('storage', type, key, location, numel, view_metadata); zip: ('storage', type, key, location, numel)
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage" and isinstance(pid[1], _StorageType)
                and isinstance(pid[2], str) and isinstance(pid[4], int) and pid[4] >= 0):  # fmt: skip
            raise CheckpointError(f"unexpected persistent id in the checkpoint: {str(pid)[:200]}")
        if len(pid) == 6 and pid[5] is not None:
            raise CheckpointError("the checkpoint holds a storage view (a pre-1.0 format); save it again with torch.save")
        ref = _StorageRef(pid[2], STORAGE_DTYPES[pid[1].name], pid[4])
        if self.storages.setdefault(ref.key, ref) != ref:
            raise CheckpointError(f"storage {ref.key!r} is named twice with different types or sizes")
        return ref


def _unpickle(stream, path, unreadable="not a readable state dict pickle"):
    """The next pickle of ``stream``; anything but a pickle of admitted objects is a
    :class:`CheckpointError` naming ``path`` and saying it is ``unreadable``."""
    try:
        return _Unpickler(stream).load()
    except CheckpointError:
        raise
    except Exception as err:  # a hostile or truncated stream raises many kinds
        raise CheckpointError(f"{path}: {unreadable} ({type(err).__name__}: {str(err)[:200]})") from err


def _element_size(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def _as_array(raw: bytes, dtype: str, numel: int, key: str) -> np.ndarray:
    """The ``numel`` elements of storage ``key`` from ``raw`` (bfloat16 widened to float32)."""
    size = _element_size(dtype)
    if len(raw) != numel * size:
        raise CheckpointError(f"storage {key!r}: {len(raw)} bytes for {numel} elements of {size} bytes")
    if dtype == "bfloat16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, dtype)


def _array(tensor: _Tensor, storages: dict[str, np.ndarray]) -> np.ndarray:
    """A tensor's array (a copy, in C order) from its storage."""
    data = storages[tensor.storage.key]
    if not tensor.shape:
        return np.array(data[tensor.offset])
    view = np.lib.stride_tricks.as_strided(data[tensor.offset:], tensor.shape, [s * data.itemsize for s in tensor.stride], writeable=False)
    return np.array(view)


def _state_dict(obj, path) -> dict[str, _Tensor]:
    """The pickled object as a flat mapping of names to tensors (``{"state_dict": ...}`` unwrapped).

    Raises:
        CheckpointError: anything else.
    """
    if isinstance(obj, dict) and len(obj) == 1 and "state_dict" in obj:
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, _Tensor) for k, v in obj.items()):
        raise CheckpointError(f"{path}: not a state dict (a mapping of names to tensors)")
    return obj


def _references(state: dict[str, _Tensor]) -> dict[str, _StorageRef]:
    return {tensor.storage.key: tensor.storage for tensor in state.values()}


def _nbytes(ref: _StorageRef) -> int:
    return ref.numel * _element_size(ref.dtype)


def _read_zip(path) -> tuple[dict[str, _Tensor], dict[str, np.ndarray]]:
    with zipfile.ZipFile(path) as archive:
        entries = {info.filename: info for info in archive.infolist()}
        pickles = [n for n in entries if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pickles) != 1:
            raise CheckpointError(f"{path}: a zip file without one data.pkl (entries: {list(entries)[:5]}); not a torch.save checkpoint")
        if any(info.compress_type != zipfile.ZIP_STORED for info in entries.values()):
            raise CheckpointError(f"{path}: compressed entries; torch.save stores its entries uncompressed")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = f"{prefix}byteorder"
        if byteorder in entries and archive.read(byteorder).strip() != b"little":
            raise CheckpointError(f"{path}: a big-endian checkpoint; save it again on a little-endian machine")
        state = _state_dict(_unpickle(io.BytesIO(archive.read(pickles[0])), path), path)
        storages = {}
        for key, ref in _references(state).items():
            info = entries.get(f"{prefix}data/{key}")
            if info is None:
                raise CheckpointError(f"{path}: storage {key!r} is missing (no entry {prefix}data/{key})")
            if info.file_size != _nbytes(ref):
                raise CheckpointError(f"storage {key!r}: {info.file_size} bytes for {ref.numel} elements of "
                                      f"{_element_size(ref.dtype)} bytes")  # fmt: skip
            storages[key] = _as_array(archive.read(info), ref.dtype, ref.numel, key)
    return state, storages


def _read_legacy(path) -> tuple[dict[str, _Tensor], dict[str, np.ndarray]]:
    size_on_disk = os.path.getsize(path)
    with open(path, "rb") as stream:
        not_torch = "neither a zip nor a legacy torch.save file"
        if _unpickle(stream, path, not_torch) != LEGACY_MAGIC:
            raise CheckpointError(f"{path}: {not_torch} (no magic number)")
        if _unpickle(stream, path) != LEGACY_PROTOCOL:
            raise CheckpointError(f"{path}: legacy torch.save protocol other than {LEGACY_PROTOCOL}")
        facts = _unpickle(stream, path)
        if not isinstance(facts, dict) or not facts.get("little_endian", False):
            raise CheckpointError(f"{path}: a checkpoint written on a big-endian machine or without its system facts")
        state = _state_dict(_unpickle(stream, path), path)
        keys = _unpickle(stream, path)
        refs = _references(state)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or sorted(keys) != sorted(refs):
            raise CheckpointError(f"{path}: the storage list does not match the storages the tensors name")
        storages = {}
        for key in keys:
            head = stream.read(8)
            if len(head) != 8:
                raise CheckpointError(f"{path}: truncated before storage {key!r}")
            (numel,) = struct.unpack("<q", head)
            ref = refs[key]
            if numel != ref.numel:
                raise CheckpointError(f"{path}: storage {key!r} holds {numel} elements, its record says {ref.numel}")
            if _nbytes(ref) > size_on_disk - stream.tell():
                raise CheckpointError(f"{path}: storage {key!r} of {_nbytes(ref)} bytes runs past the end of the file")
            storages[key] = _as_array(stream.read(_nbytes(ref)), ref.dtype, numel, key)
        if stream.read(1):
            raise CheckpointError(f"{path}: bytes left after the last storage")
    return state, storages


def _is_zip(path) -> bool:
    """A zip file as ``torch.save`` writes it (a local file header first, as torch checks)."""
    with open(path, "rb") as stream:
        return stream.read(4) == b"PK\x03\x04"


def read_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a ``torch.save``-d state dict, ``{name: array}`` in the file's order.

    Both of ``torch.save``'s formats are read:

    * the zip format (PyTorch >= 1.6): ``<archive>/data.pkl`` and one ``<archive>/data/<key>``
      entry of raw little-endian bytes per storage;
    * the legacy format: pickles of the magic number, the protocol version and the system facts,
      the object pickle, the list of storage keys, then each storage as an int64 element count
      and its bytes, in the order of that list.

    bfloat16 tensors come back as float32.

    Raises:
        CheckpointError: a pickle global other than tensors and ordered dicts (named, not run), a
            file of neither format, a truncated, damaged or inconsistent file, a pickle that is not
            a flat mapping of names to tensors, or views that would take far more memory than the
            file (more than four times its size, at least 4 MiB).
        OSError: the file cannot be read.
    """
    path = os.fspath(path)
    try:
        state, storages = _read_zip(path) if _is_zip(path) else _read_legacy(path)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as err:
        raise CheckpointError(f"{path}: a damaged checkpoint ({type(err).__name__}: {str(err)[:200]})") from err
    total = sum(math.prod(t.shape) * storages[t.storage.key].itemsize for t in state.values())
    if total > 4 * max(os.path.getsize(path), 1 << 20):
        raise CheckpointError(f"{path}: its tensors would take {total} bytes from a file of {os.path.getsize(path)}: "
                              "views that repeat their storages; refused")  # fmt: skip
    return {name: _array(tensor, storages) for name, tensor in state.items()}
