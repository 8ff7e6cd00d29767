"""The PyTorch state dict reader: both formats read back exactly, and a checkpoint is untrusted
input (a pickle naming anything but tensors and ordered dicts is refused before it runs)."""

import pickle
import posix
import re
import zipfile

import numpy as np
import pytest

from tests.torch_files import view, write_state_dict
from tfhash.state_dicts import LEGACY_MAGIC, LEGACY_PROTOCOL, CheckpointError, read_state_dict

FORMATS = pytest.mark.parametrize("legacy", [True, False], ids=["legacy", "zip"])


def _tensors():
    rng = np.random.default_rng(0)
    return {"conv.weight": rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "bn.running_var": rng.random(4).astype(np.float32),
            "half": rng.normal(size=(2, 5)).astype(np.float16), "bn.num_batches_tracked": np.array(7, np.int64),
            "empty": np.zeros((0, 3), np.float32)}  # fmt: skip


@FORMATS
def test_both_formats_read_back_every_tensor_exactly(tmp_path, legacy):
    path, tensors = tmp_path / "w.pth", _tensors()
    write_state_dict(path, tensors, legacy=legacy)
    assert zipfile.is_zipfile(path) is not legacy
    read = read_state_dict(path)
    assert list(read) == list(tensors)
    for name, array in tensors.items():
        assert read[name].dtype == array.dtype and read[name].shape == array.shape
        np.testing.assert_array_equal(read[name], array)


class _System:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return posix.system, (f"touch {self.marker}",)  # os.system itself (tests/tiers.py wraps os's name)


@FORMATS
def test_a_pickle_that_calls_os_system_is_refused_and_nothing_runs(tmp_path, legacy):
    marker, path = tmp_path / "ran", tmp_path / "evil.pth"
    write_state_dict(path, _tensors(), legacy=legacy, obj={"weight": _System(marker)})
    with pytest.raises(CheckpointError, match=r"names posix\.system.*refused without running it"):
        read_state_dict(path)
    assert not marker.exists()


@FORMATS
def test_other_globals_and_non_state_dicts_are_refused(tmp_path, legacy):
    path = tmp_path / "w.pth"
    write_state_dict(path, _tensors(), legacy=legacy, obj={"weight": np.ones(3)})  # numpy's reconstructor
    with pytest.raises(CheckpointError, match=r"names numpy\.core\.multiarray\._reconstruct"):
        read_state_dict(path)
    write_state_dict(path, {}, legacy=legacy, obj={"step": 3})
    with pytest.raises(CheckpointError, match="not a state dict"):
        read_state_dict(path)


def test_truncated_inconsistent_and_foreign_files_are_refused(tmp_path):
    path = tmp_path / "w.pth"
    write_state_dict(path, _tensors(), legacy=True)
    whole = path.read_bytes()
    path.write_bytes(whole[:-10])
    with pytest.raises(CheckpointError, match="storage '3' of 8 bytes runs past the end of the file"):
        read_state_dict(path)
    path.write_bytes(whole + b"x")
    with pytest.raises(CheckpointError, match="bytes left"):
        read_state_dict(path)
    path.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(CheckpointError, match="no magic number"):
        read_state_dict(path)
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(path))}: neither a zip nor a legacy torch.save file \("):
        read_state_dict(path)
    write_state_dict(path, _tensors(), legacy=False)
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data[:-4] if name == "archive/data/0" else data)
    with pytest.raises(CheckpointError, match="storage '0': 428 bytes for 108 elements"):
        read_state_dict(path)


@FORMATS
def test_views_at_an_offset_and_shared_storages_read_as_pytorch_lays_them_out(tmp_path, legacy):
    path, data = tmp_path / "w.pth", np.arange(12, dtype=np.float32)
    obj = {"strided": view(data, "s", (2, 3), offset=2, stride=(1, 2)), "whole": view(data, "s", (12,)),
           "scalar": view(data, "s", (), offset=5)}  # fmt: skip
    write_state_dict(path, {}, legacy=legacy, obj=obj, storages={"s": data})
    read = read_state_dict(path)
    np.testing.assert_array_equal(read["strided"], [[2, 4, 6], [3, 5, 7]])
    np.testing.assert_array_equal(read["whole"], data)
    assert read["scalar"] == 5 and read["scalar"].shape == ()


@FORMATS
@pytest.mark.parametrize("case, message", [
    ("past the end", "reaches past its storage of 4 elements"),
    ("zero stride", "reaches past its storage of 1 elements"),
    ("one key, two sizes", "storage 's' is named twice with different types or sizes"),
    ("state of a record", "sets the state of a Tensor record"),
    ("repeated views", "views that repeat their storages"),
])  # fmt: skip
def test_records_that_would_read_outside_their_storage_or_blow_up_memory_are_refused(tmp_path, legacy, case, message):
    small, big = np.zeros(4, np.float32), np.zeros(1 << 18, np.float32)
    obj, storages = {
        "past the end": ({"a": view(small, "s", (2, 2), offset=1)}, {"s": small}),
        "zero stride": ({"a": view(small[:1], "s", (1 << 20,) * 3, stride=(0, 0, 0))}, {"s": small[:1]}),
        "one key, two sizes": ({"a": view(small, "s", (4,)), "b": view(small, "s", (1,), numel=1)}, {"s": small}),
        "state of a record": ({"a": view(small, "s", (1,), state={"offset": 1 << 20})}, {"s": small}),
        "repeated views": ({f"a{i}": view(big, "s", big.shape) for i in range(20)}, {"s": big}),
    }[case]  # fmt: skip
    path = tmp_path / "w.pth"
    write_state_dict(path, {}, legacy=legacy, obj=obj, storages=storages)
    with pytest.raises(CheckpointError, match=message):
        read_state_dict(path)


def test_a_compressed_or_damaged_zip_and_an_oversized_count_are_refused(tmp_path):
    path = tmp_path / "w.pth"
    write_state_dict(path, _tensors(), legacy=False, compress=True)
    with pytest.raises(CheckpointError, match="compressed entries"):
        read_state_dict(path)
    write_state_dict(path, _tensors(), legacy=False)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError, match="damaged checkpoint"):
        read_state_dict(path)
    big = np.zeros(8, np.float32)
    write_state_dict(path, {}, legacy=True, obj={"a": view(big, "s", (2,), numel=1 << 40)}, storages={"s": big})
    with pytest.raises(CheckpointError, match="storage 's' holds 8 elements, its record says 1099511627776"):
        read_state_dict(path)


def _rewrite_zip(path, change):
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in change(entries).items():
            archive.writestr(name, data)


def _legacy_heads(path, heads):
    with open(path, "wb") as stream:
        for head in heads:
            pickle.dump(head, stream, protocol=2)


def test_a_wrapped_state_dict_and_bfloat16_storages_are_read(tmp_path):
    path, data = tmp_path / "w.pth", np.arange(6, dtype=np.float32)
    write_state_dict(path, {}, legacy=False, obj={"state_dict": {"w": view(data, "s", (2, 3))}}, storages={"s": data})
    np.testing.assert_array_equal(read_state_dict(path)["w"], data.reshape(2, 3))
    halves = (data.view(np.uint32) >> 16).astype(np.uint16)  # these values are exact in bfloat16
    write_state_dict(path, {}, legacy=True, obj={"w": view(halves, "s", (6,))}, storages={"s": halves})
    np.testing.assert_array_equal(read_state_dict(path)["w"], data)


def test_files_that_are_not_as_torch_writes_them_are_refused(tmp_path):
    path = tmp_path / "w.pth"
    checks = {
        "without one data.pkl": lambda e: {k.replace("data.pkl", "other.pkl"): v for k, v in e.items()},
        "a big-endian checkpoint": lambda e: {**e, "archive/byteorder": b"big"},
        "storage '0' is missing": lambda e: {k: v for k, v in e.items() if k != "archive/data/0"},
    }  # fmt: skip
    for message, change in checks.items():
        write_state_dict(path, _tensors(), legacy=False)
        _rewrite_zip(path, change)
        with pytest.raises(CheckpointError, match=message):
            read_state_dict(path)
    for heads, message in [((LEGACY_MAGIC, 1000), "protocol other than 1001"),
                           ((LEGACY_MAGIC, LEGACY_PROTOCOL, {"little_endian": False}), "big-endian machine")]:  # fmt: skip
        _legacy_heads(path, heads)
        with pytest.raises(CheckpointError, match=message):
            read_state_dict(path)
    data = np.zeros(2, np.float32)
    write_state_dict(path, {}, legacy=True, obj={"a": view(data, "s", (2,))}, storages={"s": data, "t": data})
    with pytest.raises(CheckpointError, match="storage list does not match"):
        read_state_dict(path)
