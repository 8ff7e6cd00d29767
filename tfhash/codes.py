"""Binary codes: sign, packing and Hamming distance (docs/design.md s.2).

Conventions used everywhere in tfhash:

* continuous code ``F(x)`` in R^K; binary code ``b = sign(F)`` with ``sign(0) := +1``, stored as
  ``int8`` +-1;
* packed form: bit 1 where ``b = +1``, ``numpy.packbits(..., bitorder="big")`` along the last axis,
  so packed storage needs K to be a multiple of 8;
* Hamming distance ``d(b1, b2) = popcount(b1 xor b2) = (K - b1 . b2) / 2``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_bits", "sign_codes", "pack_codes", "unpack_codes", "as_packed", "hamming_distances"]

#: popcount of every byte value.
POPCOUNT_TABLE = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def check_bits(bits) -> int:
    """The code length K as an ``int``: a positive multiple of 8, the lengths packed storage holds
    (one code is K / 8 whole bytes).

    Raises:
        ValueError: any other value, naming it and lengths that work.
    """
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or bits <= 0 or bits % 8:
        raise ValueError(f"bits must be a positive multiple of 8 (a code is stored as K / 8 whole bytes), got {bits!r}; "
                         "use e.g. 16, 32, 48 or 64")  # fmt: skip
    return int(bits)


def sign_codes(values: np.ndarray) -> np.ndarray:
    """Return the +-1 ``int8`` code of continuous values, with sign(0) = +1 (docs/design.md s.2)."""
    values = np.asarray(values)
    if values.ndim < 1:
        raise ValueError("codes need at least one dimension (the K bits)")
    if np.issubdtype(values.dtype, np.floating) and not np.all(np.isfinite(values)):
        raise ValueError("cannot binarise codes that contain NaN or infinity")
    return np.where(values >= 0, 1, -1).astype(np.int8)


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """Pack +-1 (or {0,1}) codes of shape (..., K) into ``uint8`` of shape (..., K / 8).

    Values > 0 become bit 1; anything else (-1 or 0) becomes bit 0. K must be a multiple of 8.
    """
    codes = np.asarray(codes)
    if codes.ndim < 1:
        raise ValueError("codes need at least one dimension (the K bits)")
    bits = codes.shape[-1]
    if bits % 8:
        raise ValueError(f"packed storage needs K to be a multiple of 8, got K={bits}")
    return np.packbits(codes > 0, axis=-1, bitorder="big")


def unpack_codes(packed: np.ndarray, bits: int | None = None) -> np.ndarray:
    """Inverse of :func:`pack_codes`: ``uint8`` (..., K/8) to ``int8`` +-1 (..., K)."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise TypeError(f"packed codes must be uint8, got {packed.dtype}")
    unpacked = np.unpackbits(packed, axis=-1, bitorder="big")
    if bits is not None:
        if bits > unpacked.shape[-1] or bits % 8:
            raise ValueError(f"bits={bits} does not match packed width {packed.shape[-1]} bytes")
        unpacked = unpacked[..., :bits]
    return (unpacked.astype(np.int8) * 2 - 1).astype(np.int8)


def as_packed(codes: np.ndarray, name: str = "codes") -> np.ndarray:
    """Accept +-1 codes (any numeric dtype) or already packed ``uint8`` codes; return packed 2-D.

    A ``uint8`` array is taken as packed. Anything else must hold only -1 and +1 (0 is refused:
    it is ambiguous between a zero bit and an unbinarised value).
    """
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise ValueError(f"{name} must be 2-D (items x bits), got shape {codes.shape}")
    if codes.dtype == np.uint8:
        return np.ascontiguousarray(codes)
    if codes.dtype == np.bool_:
        raise TypeError(f"{name}: pass +-1 codes or packed uint8, not booleans")
    if codes.size and not np.all((codes == 1) | (codes == -1)):
        raise ValueError(
            f"{name} must be +-1 codes or packed uint8; binarise continuous codes with sign_codes()"
        )
    return pack_codes(codes)


def hamming_distances(query_packed: np.ndarray, db_packed: np.ndarray) -> np.ndarray:
    """All Hamming distances between packed codes: (m, B) x (n, B) -> (m, n) ``uint16``.

    Memory is O(m * n * B) bytes for the XOR; callers chunk the queries (see
    :mod:`tfhash.metrics.ranking`).
    """
    query_packed = np.asarray(query_packed, dtype=np.uint8)
    db_packed = np.asarray(db_packed, dtype=np.uint8)
    if query_packed.shape[-1] != db_packed.shape[-1]:
        raise ValueError(
            f"code widths differ: queries have {query_packed.shape[-1] * 8} bits, "
            f"database has {db_packed.shape[-1] * 8}"
        )
    nbytes = query_packed.shape[-1]
    if nbytes % 8 == 0:
        # Word-wise XOR, then a byte table: fewer, larger XORs than byte by byte.
        q = query_packed.view(np.uint64)
        d = db_packed.view(np.uint64)
        xor = np.bitwise_xor(q[:, None, :], d[None, :, :]).view(np.uint8)
    else:
        xor = np.bitwise_xor(query_packed[:, None, :], db_packed[None, :, :])
    return POPCOUNT_TABLE[xor].sum(axis=-1, dtype=np.uint16)
