"""Optimizers with a separate rate for a pretrained backbone, as the papers fine-tune, and
:func:`compile_fine_tuning`, which compiles a model with the one a recipe
(:class:`tfhash.fine_tuning.FineTuning`) makes."""

from __future__ import annotations

from dataclasses import replace

import keras
from keras import ops

__all__ = ["BackboneRateSGD", "BackboneRateAdam", "BackboneRateAdamW", "compile_fine_tuning", "backbone_variables"]


class _BackboneRates:
    """Mixin for a Keras optimizer: registered backbone variables step at ``backbone_scale`` times
    the learning rate, 0 before ``frozen_steps``; coupled L2 ``weight_decay`` on every variable.

    The optimizer's learning rate (a schedule) drives the new layers, and the variables registered with
    :meth:`~_BackboneRates.set_backbone_variables` move at ``backbone_scale`` times it, or not at all
    during the first ``frozen_steps`` (a frozen warm-up). Weight decay is the coupled L2 of the papers'
    frameworks (``gradient + weight_decay * variable``, as PyTorch's and Caffe's SGD apply it) for SGD
    and Adam, and AdamW's decoupled decay for ``"adamw"`` (:class:`BackboneRateAdamW`).
    Like Keras's ``exclude_from_weight_decay``, the registered variables are not part of the
    optimizer's config: recompile with :func:`compile_fine_tuning` after loading a
    model to resume.
    """

    def __init__(self, *args, backbone_scale: float = 1.0, frozen_steps: int = 0, l2: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.backbone_scale = float(backbone_scale)
        self.frozen_steps = int(frozen_steps)
        self.l2 = float(l2)
        self._backbone_keys: set = set()

    def set_backbone_variables(self, variables) -> None:
        """The variables that take the backbone rate (the pretrained layers)."""
        self._backbone_keys = {self._var_key(v) for v in variables}

    def update_step(self, gradient, variable, learning_rate):
        if self.l2:
            gradient = ops.add(ops.cast(gradient, variable.dtype), ops.multiply(ops.cast(self.l2, variable.dtype), variable))
        if self._var_key(variable) in self._backbone_keys:
            scale = ops.where(ops.less(self.iterations, self.frozen_steps), 0.0, self.backbone_scale)
            learning_rate = ops.multiply(ops.cast(learning_rate, "float32"), scale)
            self._decay_backbone(variable, learning_rate)
        return super().update_step(gradient, variable, learning_rate)

    def _decay_backbone(self, variable, learning_rate) -> None:
        """Decoupled weight decay of a backbone variable at its own rate (AdamW only)."""

    def get_config(self):
        return {**super().get_config(), "backbone_scale": self.backbone_scale, "frozen_steps": self.frozen_steps, "l2": self.l2}


@keras.saving.register_keras_serializable(package="tfhash")
class BackboneRateSGD(_BackboneRates, keras.optimizers.SGD):
    """SGD (with momentum) with a separate rate for the backbone (see module docstring)."""


@keras.saving.register_keras_serializable(package="tfhash")
class BackboneRateAdam(_BackboneRates, keras.optimizers.Adam):
    """Adam with a separate rate for the backbone (see module docstring)."""


@keras.saving.register_keras_serializable(package="tfhash")
class BackboneRateAdamW(_BackboneRates, keras.optimizers.AdamW):
    """AdamW (decoupled weight decay) with a separate rate for the backbone (see module docstring):
    a backbone variable decays at the backbone's rate, not at all while it is frozen."""

    def _use_weight_decay(self, variable):
        # Keras decays every variable at the global rate before the step; the backbone's decay is
        # applied in update_step instead, at its own rate.
        return self._var_key(variable) not in self._backbone_keys and super()._use_weight_decay(variable)

    def _decay_backbone(self, variable, learning_rate) -> None:
        if self.weight_decay and super()._use_weight_decay(variable):
            rate = ops.multiply(ops.cast(learning_rate, variable.dtype), ops.cast(self.weight_decay, variable.dtype))
            variable.assign(ops.subtract(variable, ops.multiply(variable, rate)))


def backbone_variables(model) -> list:
    """The pretrained variables of a tfhash model: those of the backbone that training updates for
    each of its modalities (``model.modality_backbone``: every tower of a cross-modal model, the
    student's of MT-SCDH, whose teacher is not trained)."""
    return [v for modality in model.modalities for v in model.modality_backbone(modality).trainable_variables]


def compile_fine_tuning(model, recipe, epochs: int, steps_per_epoch: int, **compile_kwargs):
    """Compile ``model`` with the optimizer of ``recipe`` (a :class:`tfhash.fine_tuning.FineTuning`);
    its backbone variables take the backbone rate (the same rate when ``backbone_learning_rate`` is
    None, as for a backbone trained from scratch). A step schedule without ``decay_epochs`` decays
    at 5/8 and 7/8 of ``epochs`` (SCDH Sec. V-A: at 100 and 140 of 160). Returns the optimizer."""
    if recipe.schedule == "step" and not recipe.decay_epochs:
        recipe = replace(recipe, decay_epochs=sorted({max(1, round(epochs * 5 / 8)), max(1, round(epochs * 7 / 8))}))
    optimizer = recipe.make_optimizer(epochs, steps_per_epoch)
    model.compile(optimizer=optimizer, **compile_kwargs)
    optimizer.set_backbone_variables(backbone_variables(model))
    return optimizer
