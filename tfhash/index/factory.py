"""Build an index from a short description, in the spirit of FAISS's ``index_factory``.

========================  ==========================================================
description               index
========================  ==========================================================
``BFlat``                 exact Hamming k-NN (FAISS IndexBinaryFlat)
``BIVF<nlist>``           inverted lists, approximate (``nprobe`` keyword, default 16)
``BMultiHash<nhash>``     multi-index hashing, approximate (``nflip`` keyword, default 1)
``ScaNN``                 ScaNN tree + asymmetric hashing + reordering, approximate
``ScaNNBrute``            ScaNN brute force (exact distances, ties in any order)
========================  ==========================================================
"""

from __future__ import annotations

import re

from tfhash.index.base import HashIndex, IndexError_


def index_factory(bits: int, description: str, **params) -> HashIndex:
    """Create an empty index of ``bits``-bit codes from ``description`` (table above); extra
    keyword parameters go to the index's constructor.

    Raises:
        IndexError_: an unknown description.
    """
    from tfhash.index.binary import BinaryIndex
    from tfhash.index.scann_index import ScannIndex

    text = description.strip()
    if text == "BFlat":
        return BinaryIndex(bits, "flat", **params)
    if match := re.fullmatch(r"BIVF(\d+)", text):
        return BinaryIndex(bits, "ivf", nlist=int(match.group(1)), **params)
    if match := re.fullmatch(r"BMultiHash(\d+)", text):
        return BinaryIndex(bits, "multihash", nhash=int(match.group(1)), **params)
    if text == "ScaNN":
        return ScannIndex(bits, "ah", **params)
    if text == "ScaNNBrute":
        return ScannIndex(bits, "brute", **params)
    raise IndexError_(
        f"unknown index description {description!r}; use BFlat, BIVF<nlist>, BMultiHash<nhash>, ScaNN or ScaNNBrute"
    )
