"""Per-tower settings of the feature-vector towers (MLP backbones), typed: :class:`Tower`.

A training spec holds three settings that may differ between the towers of a cross-modal model:
``hidden`` (layer widths), ``input_map`` and ``fine_tuning.input_dropout``; each is one value for
every tower or ``{modality: value}`` naming towers. :func:`checked_per_tower` checks one such
setting on its own (when the spec is made); :func:`towers_of` resolves the three against the
data's towers into one :class:`Tower` each (when the data is known), refusing a tower the data
does not have. This module imports nothing heavy, so a recipe or a pipeline config is checked
before Keras loads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tfhash.config_keys import suggestion

__all__ = ["INPUT_MAPS", "Tower", "checked_per_tower", "checked_widths", "checked_input_map", "checked_input_dropout", "dropout_rate", "values_of", "towers_of"]

#: The input maps of a feature-vector tower (:mod:`tfhash.layers.input_maps`): none, standardisation
#: (z-scores), RBF kernel features on anchors then z-scores; each adapted to the training rows.
INPUT_MAPS = ("none", "standardise", "rbf")


@dataclass(frozen=True)
class Tower:
    """One feature-vector tower's settings (:func:`tfhash.models.mlp`).

    Attributes:
        hidden: the widths of its hidden layers (``()``: a linear tower).
        input_map: what its raw features pass through first (:data:`INPUT_MAPS`).
        input_dropout: dropout on its input features, in [0, 1).
    """

    hidden: tuple[int, ...]
    input_map: str = "none"
    input_dropout: float = 0.0


def checked_per_tower(value, where: str, check: Callable):
    """``value`` (one value for every tower, or ``{modality: value}``) with ``check(one, name)``
    applied to each value (``name``: ``where``, or ``where of 'modality'``).

    Raises:
        ValueError: an empty dict (naming ``where``), or as ``check`` does.
    """
    if isinstance(value, dict):
        if not value:
            raise ValueError(f"{where} names no tower; give one value for every tower, or {{modality: value}}")
        return {str(m): check(v, f"{where} of {m!r}") for m, v in value.items()}
    return check(value, where)


def _widths(value, name: str) -> tuple[int, ...]:
    if not (isinstance(value, (list, tuple)) and all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in value)):
        raise ValueError(f"{name} must be a list of positive layer widths, e.g. [1024] ([] for a linear tower), got {value!r}")
    return tuple(value)


def _input_map(value, name: str) -> str:
    if value not in INPUT_MAPS:
        raise ValueError(f"{name} is {value!r}; choose one of {list(INPUT_MAPS)}{suggestion(str(value), INPUT_MAPS)}")
    return value


def dropout_rate(value, name: str) -> float:
    """A dropout rate in [0, 1) as a float.

    Raises:
        ValueError: not a number in [0, 1); ``name`` names the setting.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a dropout rate in [0, 1), got {value!r}")
    return float(value)


def checked_widths(hidden, where: str = "hidden") -> tuple[int, ...] | dict[str, tuple[int, ...]]:
    """An MLP's layer widths, one list for every tower or ``{modality: widths}``, as tuples.

    Raises:
        ValueError: not positive integer widths; ``where`` names the setting.
    """
    return checked_per_tower(hidden, where, _widths)


def checked_input_map(input_map, where: str = "input_map") -> str | dict[str, str]:
    """An input map setting (:data:`INPUT_MAPS`), one for every tower or ``{modality: map}``.

    Raises:
        ValueError: an unknown map, with the nearest known one.
    """
    return checked_per_tower(input_map, where, _input_map)


def checked_input_dropout(rate, where: str = "input_dropout") -> float | dict[str, float]:
    """An input dropout setting, one rate for every tower or ``{modality: rate}``.

    Raises:
        ValueError: a rate outside [0, 1).
    """
    return checked_per_tower(rate, where, dropout_rate)


def values_of(setting) -> list:
    """The values of a per-tower setting: its one value, or each tower's."""
    return list(setting.values()) if isinstance(setting, dict) else [setting]


def towers_of(hidden, input_map, input_dropout, modalities: Iterable[str],
              names: tuple[str, str, str] = ("hidden", "input_map", "input_dropout")) -> dict[str, Tower]:  # fmt: skip
    """``{modality: Tower}`` for the data's towers ``modalities`` from the three per-tower settings
    (each checked by its ``checked_*`` function; ``names`` are the settings' names in messages). A
    per-tower ``hidden`` names every tower; a per-tower ``input_map`` or ``input_dropout`` may leave
    towers out (``"none"``, 0 for them).

    Raises:
        ValueError: a setting naming a tower the data does not have, or ``hidden`` leaving one out;
            the message names the setting, its towers and the data's.
    """
    modalities = [str(m) for m in modalities]
    checks = (checked_widths, checked_input_map, checked_input_dropout)
    settings = [check(value, name) for check, value, name in zip(checks, (hidden, input_map, input_dropout), names, strict=True)]
    for value, name, every in zip(settings, names, (True, False, False), strict=True):
        if isinstance(value, dict) and (set(value) - set(modalities) or (every and set(value) != set(modalities))):
            raise ValueError(f"{name} names the towers {sorted(value)}; the data's towers are {sorted(modalities)}"
                             + (": give one list of widths, or name each tower" if every else ""))  # fmt: skip

    def of(value, modality, default):
        return value.get(modality, default) if isinstance(value, dict) else value

    return {m: Tower(hidden=of(settings[0], m, ()), input_map=of(settings[1], m, "none"), input_dropout=of(settings[2], m, 0.0))
            for m in modalities}  # fmt: skip
