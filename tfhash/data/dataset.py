"""The container every loader returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tfhash.data.splits import Split

__all__ = ["DataFormatError", "HashingDataset"]


class DataFormatError(ValueError):
    """A dataset file exists but its content is not what the format promises."""


@dataclass
class HashingDataset:
    """Arrays of one dataset plus its standard split.

    Attributes:
        name: dataset name.
        inputs: modality name -> array whose first axis indexes examples (e.g. ``{"image": ...}``,
            or ``{"image": ..., "text": ...}`` for paired cross-modal data).
        labels: ``(n, C)`` ``uint8`` multi-hot labels (one-hot for single-label data).
        class_names: the C class / tag names.
        split: query / database / train indices into the rows, with the seed that drew them.
    """

    name: str
    inputs: dict[str, np.ndarray]
    labels: np.ndarray
    class_names: list[str]
    split: Split
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.labels.shape[0]
        for modality, array in self.inputs.items():
            if array.shape[0] != n:
                raise DataFormatError(
                    f"{self.name}: modality {modality!r} has {array.shape[0]} rows, labels have {n}"
                )

    @property
    def num_classes(self) -> int:
        return self.labels.shape[1]

    @property
    def single_label(self) -> bool:
        return bool(np.all(self.labels.sum(axis=1) == 1))

    @property
    def class_ids(self) -> np.ndarray:
        """Integer class ids; only for single-label data."""
        if not self.single_label:
            raise ValueError(f"{self.name} is multi-label: it has no single class id per example")
        return self.labels.argmax(axis=1)

    def part(self, which: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Inputs and labels of ``"train"``, ``"query"`` or ``"database"``."""
        if which not in ("train", "query", "database"):
            raise ValueError(f"unknown split part {which!r}; use train, query or database")
        index = getattr(self.split, which)
        return {k: v[index] for k, v in self.inputs.items()}, self.labels[index]

    def describe(self) -> dict:
        return {
            "name": self.name,
            "examples": int(self.labels.shape[0]),
            "num_classes": self.num_classes,
            "inputs": {k: list(v.shape[1:]) for k, v in self.inputs.items()},
            "split": self.split.describe(),
        }
