"""Learning-rate schedules over optimizer steps (Keras is imported when one is made)."""

from __future__ import annotations

__all__ = ["SCHEDULES", "learning_rate_schedule"]

#: The schedules a fine-tuning recipe names (:func:`learning_rate_schedule`).
SCHEDULES = ("constant", "step", "cosine")


def learning_rate_schedule(base: float, schedule: str, epochs: int, steps_per_epoch: int, decay_epochs=(),
                           decay_rate: float = 0.2):  # fmt: skip
    """The learning rate over optimizer steps: ``"constant"``; ``"step"``, multiplied by
    ``decay_rate`` at each epoch of ``decay_epochs`` (SCDH Sec. V-A: 0.2, "decreases by 80%");
    ``"cosine"``, from ``base`` to 0 over ``epochs`` (SGDR without restarts).

    Raises:
        ValueError: a schedule not in :data:`SCHEDULES`.
    """
    import keras

    if schedule == "constant":
        return float(base)
    if schedule == "step":
        # PiecewiseConstantDecay switches after a boundary step: the decayed rate starts with the
        # first step of epoch e (0-based step e * steps_per_epoch).
        boundaries = [int(e) * int(steps_per_epoch) - 1 for e in sorted(decay_epochs)]
        if not boundaries:
            return float(base)
        values = [float(base) * float(decay_rate) ** i for i in range(len(boundaries) + 1)]
        return keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, values)
    if schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(float(base), max(1, int(epochs) * int(steps_per_epoch)))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}; choose one of {SCHEDULES}")
