"""Typed config sections: a dataclass field per key with its default and what it does
(:func:`config_key`), and the checks every section makes of what it is given (an unknown key refused
with the nearest known one, :func:`check_keys`). The pipeline config, the training spec and its
fine-tuning section use them; this module imports no tfhash module.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import field

__all__ = ["config_key", "REQUIRED", "check_keys", "check_count", "suggestion"]

#: The default of a key that has none: the config must set it.
REQUIRED = dataclasses.MISSING


def config_key(default, text: str):
    """A config key: its default (a value, or a factory such as ``dict`` or a lambda for a
    mutable one; :data:`REQUIRED` for none) and what it does (the ``doc`` of its field's metadata,
    which the pipeline's key table prints)."""
    if default is REQUIRED:
        return field(metadata={"doc": text})
    if callable(default):
        return field(default_factory=default, metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


def suggestion(word: str, known) -> str:
    """``"; did you mean 'x'?"`` for the known word nearest ``word`` (empty when none is near)."""
    near = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


def check_keys(section: dict, known, where: str) -> None:
    """Refuse keys of ``section`` that are not ``known``, each with the nearest known key."""
    unknown = sorted(set(section) - set(known))
    if unknown:
        hints = "; ".join(f"{where + key!r}{suggestion(key, known).replace('; ', ': ', 1)}" for key in unknown)
        raise ValueError(f"unknown setting{'s' if len(unknown) > 1 else ''} {hints} (known: {sorted(known)})")


def check_count(name: str, value, optional: bool = False) -> None:
    """``value`` must be a positive integer (or None when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer{' or null' if optional else ''}, got {value!r}")
