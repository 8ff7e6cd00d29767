"""Writers of ``torch.save`` files without PyTorch, for the reader's tests: both formats, laid out
as PyTorch writes them (serialization.py's ``_legacy_save`` and ``_save``), pickled against
stand-in ``torch`` modules that exist only while writing."""

from __future__ import annotations

import collections
import io
import pickle
import sys
import types
import zipfile

import numpy as np

from tfhash.state_dicts import LEGACY_MAGIC, LEGACY_PROTOCOL

# uint16 arrays stand for bfloat16 bits (NumPy has no bfloat16).
_TAGS = {np.dtype("float32"): "FloatStorage", np.dtype("float16"): "HalfStorage", np.dtype("int64"): "LongStorage",
         np.dtype("uint8"): "ByteStorage", np.dtype("uint16"): "BFloat16Storage"}  # fmt: skip


class _Storage:
    def __init__(self, key: str, array: np.ndarray):
        self.key, self.array, self.numel = key, array, None


class _Tensor:
    def __init__(self, storage: _Storage, shape: tuple, offset: int = 0, stride: tuple | None = None, state: dict | None = None):
        self.storage, self.shape, self.offset, self.state = storage, shape, offset, state
        self.stride = stride if stride is not None else tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))

    def __reduce__(self):
        args = (self.storage, self.offset, self.shape, self.stride, False, collections.OrderedDict())
        rebuild = sys.modules["torch._utils"]._rebuild_tensor_v2
        return (rebuild, args) if self.state is None else (rebuild, args, self.state)


def view(storage: np.ndarray, key: str, shape: tuple, offset: int = 0, stride: tuple | None = None, numel: int | None = None,
         state: dict | None = None) -> _Tensor:  # fmt: skip
    """A tensor record over ``storage`` (saved under ``key``) as given, for ``write_state_dict``'s
    ``obj``: views at an offset, shared or mis-sized storages, a record with a pickled state."""
    stored = _Storage(key, storage)
    stored.numel = numel
    return _Tensor(stored, shape, offset, stride, state)


def _fake_torch():
    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):
        raise AssertionError("never called while writing")

    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    torch._utils = utils
    for tag in _TAGS.values():
        setattr(torch, tag, type(tag, (), {"__module__": "torch"}))
    return {"torch": torch, "torch._utils": utils}


def _pickler(stream, legacy: bool):
    pickler = pickle.Pickler(stream, protocol=2)

    def persistent_id(obj):
        if not isinstance(obj, _Storage):
            return None
        tag, numel = getattr(sys.modules["torch"], _TAGS[obj.array.dtype]), obj.numel if obj.numel is not None else obj.array.size
        return ("storage", tag, obj.key, "cpu", numel, None) if legacy else ("storage", tag, obj.key, "cpu", numel)

    pickler.persistent_id = persistent_id
    return pickler


def write_state_dict(path, tensors: dict[str, np.ndarray], legacy: bool, obj=None, storages: dict[str, np.ndarray] | None = None,
                     compress: bool = False) -> None:  # fmt: skip
    """``tensors`` saved as ``torch.save`` would save that state dict (``legacy``: the pre-1.6
    format); ``obj`` replaces the pickled object (a payload, or records made by :func:`view`)
    with the storages of ``tensors`` kept and ``storages`` ({key: array}) added; ``compress``
    deflates the zip's entries (torch.save never does)."""
    storages = {**{name: _Storage(str(i), np.ascontiguousarray(a)) for i, (name, a) in enumerate(tensors.items())},
                **{f"extra{key}": _Storage(key, a) for key, a in (storages or {}).items()}}  # fmt: skip
    state = collections.OrderedDict((name, _Tensor(storages[name], a.shape)) for name, a in tensors.items())
    ordered = sorted(storages.values(), key=lambda s: s.key)  # torch writes them in key order
    fakes = _fake_torch()
    saved = {name: sys.modules.get(name) for name in fakes}
    sys.modules.update(fakes)
    try:
        if legacy:
            with open(path, "wb") as stream:
                for head in (LEGACY_MAGIC, LEGACY_PROTOCOL, {"protocol_version": LEGACY_PROTOCOL, "little_endian": True}):
                    pickle.dump(head, stream, protocol=2)
                _pickler(stream, legacy=True).dump(state if obj is None else obj)
                pickle.dump([s.key for s in ordered], stream, protocol=2)
                for storage in ordered:
                    stream.write(np.int64(storage.array.size).tobytes() + storage.array.tobytes())
        else:
            buffer = io.BytesIO()
            _pickler(buffer, legacy=False).dump(state if obj is None else obj)
            with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as archive:
                archive.writestr("archive/data.pkl", buffer.getvalue())
                archive.writestr("archive/byteorder", "little")
                for storage in ordered:
                    archive.writestr(f"archive/data/{storage.key}", storage.array.tobytes())
                archive.writestr("archive/version", "3\n")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
