"""Per-tower settings of the feature-vector towers (MLP backbones): each setting is one value for
every tower, or ``{modality: value}`` naming towers. This module imports nothing heavy, so a
recipe or a pipeline config is checked before Keras loads.
"""

from __future__ import annotations

__all__ = ["INPUT_MAPS", "input_map_of", "checked_widths", "widths_of"]

#: The input maps of a feature-vector tower (:mod:`tfhash.layers.input_maps`): none, standardisation
#: (z-scores), RBF kernel features on anchors then z-scores; each adapted to the training rows.
INPUT_MAPS = ("none", "standardise", "rbf")


def input_map_of(input_map: str | dict, modality: str | None) -> str:
    """The map of ``modality`` in an ``input_map`` setting: one map for every tower, or
    ``{modality: map}`` (a modality it does not name: ``"none"``)."""
    return input_map.get(modality, "none") if isinstance(input_map, dict) else input_map


def checked_widths(hidden, where: str = "hidden") -> tuple[int, ...] | dict[str, tuple[int, ...]]:
    """An MLP's layer widths, one list for every tower or ``{modality: widths}`` (each tower named),
    as tuples.

    Raises:
        ValueError: not positive integer widths; ``where`` names the setting.
    """
    def widths(value, name):
        if not (isinstance(value, (list, tuple)) and all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in value)):
            raise ValueError(f"{name} must be a list of positive layer widths, e.g. [1024] ([] for a linear tower), got {value!r}")
        return tuple(value)

    if isinstance(hidden, dict):
        if not hidden:
            raise ValueError(f"{where} names no tower; give a list of widths, or {{modality: widths}}")
        return {str(m): widths(v, f"{where} of {m!r}") for m, v in hidden.items()}
    return widths(hidden, where)


def widths_of(hidden, modality: str | None) -> tuple[int, ...]:
    """The layer widths of ``modality``'s tower in a ``hidden`` setting (:func:`checked_widths`).

    Raises:
        ValueError: a per-tower setting that does not name ``modality``.
    """
    if not isinstance(hidden, dict):
        return tuple(hidden)
    if modality not in hidden:
        raise ValueError(f"hidden gives widths for {sorted(hidden)}, not for the tower {modality!r}; name every tower")
    return tuple(hidden[modality])
