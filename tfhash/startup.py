"""What importing tfhash holds back: the start-up notices of TensorFlow (its C++ log: CUDA plugin
registration on a machine without a GPU, TensorRT and CPU-feature notices) and of the google
client libraries (Python-version support notices), which say nothing a user of tfhash can act
on, unless the user asks for them (:func:`hold_back`); the ``tfhash`` command's ``-v`` lets both
through (:func:`let_through`).
"""

from __future__ import annotations

import os
import warnings

__all__ = ["TF_LOG_LEVEL", "GOOGLE_NOTICES", "hold_back", "let_through"]

#: The environment variable TensorFlow's C++ log reads its level from, once, at its first import.
TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
#: The warnings held back: (category, a regular expression matched at the start of the module).
GOOGLE_NOTICES = (FutureWarning, r"google(\.|$)")

_set_here = False  # whether hold_back, not the environment, set TF_LOG_LEVEL


def hold_back() -> None:
    """Set :data:`TF_LOG_LEVEL` to 3 unless the environment sets it (``TF_CPP_MIN_LOG_LEVEL=0``
    shows TensorFlow's log), and ignore :data:`GOOGLE_NOTICES` by a filter appended after every
    other, so that ``-W`` options, ``PYTHONWARNINGS`` and an application's filters come first
    (``-W default::FutureWarning`` shows them). TensorFlow reads its level once, when it is first
    imported: ``tfhash`` calls this on import, before any of its modules imports TensorFlow. The
    level is set in the process's environment, so processes it starts inherit it."""
    global _set_here
    if TF_LOG_LEVEL not in os.environ:
        os.environ[TF_LOG_LEVEL] = "3"
        _set_here = True
    category, module = GOOGLE_NOTICES
    warnings.filterwarnings("ignore", category=category, module=module, append=True)


def let_through() -> None:
    """Undo :func:`hold_back` (the level it set, not one the environment set; the notices shown
    again): for a run that asks for the full log. The level counts only if TensorFlow is not yet
    imported."""
    global _set_here
    if _set_here:
        os.environ.pop(TF_LOG_LEVEL, None)
        _set_here = False
    category, module = GOOGLE_NOTICES
    warnings.filterwarnings("default", category=category, module=module)
