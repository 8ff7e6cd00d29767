"""The numeric precision a run trains in: a run's ``mixed_precision`` setting to a Keras dtype
policy, with bfloat16 only where the machine computes it natively. Imports nothing heavy."""

from __future__ import annotations

import logging

__all__ = ["PRECISIONS", "precision_policy", "cpu_has_bfloat16", "cpu_flags"]

#: The run config's ``mixed_precision`` values (:func:`precision_policy`).
PRECISIONS = ("auto", "on", "off", "bfloat16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags of the machine's first CPU as ``/proc/cpuinfo`` lists them
    (``avx2``, ``avx512f``, ``avx512_bf16``, ``amx_bf16``, ...); empty where the file is missing
    or has no ``flags`` line (not Linux, or a sandbox hiding it)."""
    try:
        with open(cpuinfo) as handle:
            return frozenset(next((line for line in handle if line.startswith("flags")), "").partition(":")[2].split())
    except OSError:
        return frozenset()


def cpu_has_bfloat16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU computes in bfloat16 natively (AVX512_BF16 or AMX-BF16 in its flags);
    elsewhere oneDNN emulates it, slower than float32."""
    return not cpu_flags(cpuinfo).isdisjoint({"avx512_bf16", "amx_bf16"})


def precision_policy(setting: str, gpu: bool, cpuinfo: str = "/proc/cpuinfo") -> str:
    """The Keras dtype policy of a run's ``mixed_precision`` setting: ``"off"`` float32; ``"on"``
    mixed_float16; ``"auto"`` mixed_float16 with a GPU, else float32; ``"bfloat16"``
    mixed_bfloat16 on a GPU or a CPU that has it (:func:`cpu_has_bfloat16`), else float32 with a
    warning (the same run, slower, rather than a failure on another machine).

    Raises:
        ValueError: a setting not in :data:`PRECISIONS`.
    """
    if setting not in PRECISIONS:
        raise ValueError(f"mixed_precision must be one of {PRECISIONS}, got {setting!r}")
    if setting == "bfloat16":
        if gpu or cpu_has_bfloat16(cpuinfo):
            return "mixed_bfloat16"
        logging.getLogger(__name__).warning("mixed_precision 'bfloat16': this CPU has no bfloat16 instructions "
                                            "(avx512_bf16 / amx_bf16); training in float32")  # fmt: skip
        return "float32"
    return "mixed_float16" if setting == "on" or (setting == "auto" and gpu) else "float32"
