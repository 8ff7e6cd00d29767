"""What every tfhash model shares: its encoders (one per modality) and ``encode`` to +-1 codes,
sample-weight unpacking, and the reduction of per-example losses (the Keras training
conventions are :mod:`tfhash.models.training`)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from tfhash.labels import rows_text
from tfhash.losses.reduction import reduce_parts
from tfhash.models.inputs import (
    InputError,
    assert_finite_features,
    checked_features,
    is_dataset,
    readable_checks,
)

__all__ = ["DEFAULT_MODALITY", "unpack_sample_weight", "EncoderMixin", "loss_trackers", "reduce_tracked_loss", "NestedConfigMixin"]


#: The one modality of a single-input model.
DEFAULT_MODALITY = "default"


def binarize(codes):
    """sign with sign(0) = +1, as ``int8`` +-1 (docs/design.md s.2); stock ops only."""
    return ops.cast(ops.where(codes >= 0, 1, -1), "int8")


def unpack_sample_weight(sample_weight):
    """One ``(n,)`` (or ``(n, 1)``) weight array, or ``None``. For dict targets Keras's data
    adapters repeat the one ``sample_weight`` array under every key; the ``labels`` entry (else the
    first) is taken back."""
    if isinstance(sample_weight, dict):
        return sample_weight["labels"] if "labels" in sample_weight else next(iter(sample_weight.values()), None)
    if isinstance(sample_weight, (list, tuple)):
        return sample_weight[0] if sample_weight else None
    return sample_weight


def tower_encoder(backbone, hash_head, name: str) -> keras.Model:
    """backbone -> hash head as one Keras model, inputs to continuous codes F, sharing their layers
    (and so their weights) with the model they belong to."""
    try:
        inputs = backbone.input  # a functional backbone's inputs, in the structure it takes them
    except (AttributeError, ValueError):  # a subclassed backbone: no symbolic inputs
        inputs = None
    if inputs is not None:
        return keras.Model(inputs, hash_head(backbone.outputs[0]), name=name)
    return keras.Sequential([backbone, hash_head], name=name)


class EncoderMixin:
    """The encoder API every tfhash model shares.

    ``modalities``: the names of the model's inputs, one encoder each; a single-input model has
    the one modality :data:`DEFAULT_MODALITY`. ``encoder(modality)`` is the Keras model that maps
    that modality's inputs to the continuous codes F (``modality=None``: the only one of a
    single-input model), built on first use and cached; it shares the model's layers, so it
    follows training. ``encode`` gives the +-1 codes. Build encoders eagerly (e.g. call
    :meth:`encoders`) before tracing a ``tf.function`` that uses them.

    Subclasses with one ``backbone`` and one ``hash_head`` need nothing more; others override
    :meth:`modality_backbone` and :meth:`modality_head` (or :meth:`build_encoder`).
    """

    modalities: tuple[str, ...] = (DEFAULT_MODALITY,)

    def check_modality(self, modality: str | None = None) -> str:
        """``modality``, or the default one for ``None``; ValueError for an unknown name (or for
        ``None`` with several modalities)."""
        if modality is None:
            if len(self.modalities) != 1:
                raise ValueError(f"this model has modalities {list(self.modalities)}; name the one to encode")
            return self.modalities[0]
        if modality not in self.modalities:
            raise ValueError(f"unknown modality {modality!r}; this model has {list(self.modalities)}")
        return modality

    def modality_backbone(self, modality: str | None = None) -> keras.Model:
        """The backbone that training updates for ``modality``."""
        self.check_modality(modality)
        return self.backbone

    def modality_head(self, modality: str | None = None) -> keras.layers.Layer:
        """The hash layer (F) on top of :meth:`modality_backbone`."""
        self.check_modality(modality)
        return self.hash_head

    def build_encoder(self, modality: str) -> keras.Model:
        """A new encoder for ``modality`` (:meth:`encoder` caches it)."""
        return tower_encoder(self.modality_backbone(modality), self.modality_head(modality), name=f"{self.name}_encoder_{modality}")

    def encoder(self, modality: str | None = None) -> keras.Model:
        """The (cached) Keras model: ``modality``'s inputs -> continuous codes F, ``(n, K)``."""
        modality = self.check_modality(modality)
        cache = self.__dict__.get("_encoder_cache")
        if cache is None:
            cache = {}
            # Not an attribute Keras tracks: the encoders share the model's layers, and a tracked
            # copy would change the model's weights list and its saved form.
            object.__setattr__(self, "_encoder_cache", cache)
        if modality not in cache:
            cache[modality] = self.build_encoder(modality)
        return cache[modality]

    def encoders(self) -> dict:
        """``{modality: encoder}`` for every modality."""
        return {modality: self.encoder(modality) for modality in self.modalities}

    def continuous_codes(self, x, modality: str | None = None, batch_size: int = 512) -> np.ndarray:
        """Continuous codes F of ``modality``'s inputs ``x``: an array-like (a list too), or a
        ``tf.data`` dataset of input batches (or of ``(inputs, labels)`` batches, as ``fit`` takes). Non-finite inputs are refused (naming the rows), and
        so are codes a model with non-finite weights makes.

        Raises:
            InputError: NaN or infinity in the inputs or the codes.
        """
        if is_dataset(x):  # batches of inputs, or of (inputs, targets, ...) as fit takes them: the inputs are checked
            x = x.map(lambda inputs, *rest: (assert_finite_features(inputs, "a batch of the dataset"), *rest) if rest
                      else assert_finite_features(inputs, "a batch of the dataset"))  # fmt: skip
        else:
            x = checked_features(x, "x")
            _check_input_shape(x, self.encoder(modality).input_shape, modality)
        with readable_checks():
            codes = np.asarray(self.encoder(modality).predict(x, batch_size=batch_size, verbose=0))
        bad = np.flatnonzero(~np.isfinite(codes).all(axis=-1))
        if bad.size:
            raise InputError(f"the model made non-finite codes for {rows_text(bad, len(codes))}: its weights hold NaN or "
                             "infinity (a training run that diverged); retrain it")  # fmt: skip
        return codes

    def encode(self, x, modality: str | None = None, batch_size: int = 512) -> np.ndarray:
        """+-1 ``int8`` codes of ``modality``'s inputs ``x`` (as :meth:`continuous_codes` takes
        them). ``predict`` keeps Keras's meaning: the model's continuous outputs."""
        return np.asarray(binarize(self.continuous_codes(x, modality, batch_size)))


def _check_input_shape(x, expected, modality: str | None) -> None:
    """Refuse arrays whose shape beyond the batch is not the encoder's (its unknown sizes match any)."""
    if isinstance(x, dict) or not isinstance(expected, tuple):
        return
    want = tuple(expected[1:])
    if len(x.shape) - 1 != len(want) or any(w is not None and w != got for w, got in zip(want, x.shape[1:], strict=False)):
        shown = "(n, " + ", ".join("any" if w is None else str(w) for w in want) + ")"
        raise InputError(f"x has shape {tuple(x.shape)}; this model encodes {f'{modality} ' if modality else ''}inputs of "
                         f"shape {shown}: pass the features it was trained on")


def loss_trackers(model: keras.Model, names) -> dict:
    """Create one ``Mean`` metric per loss part, set as attributes so Keras tracks and resets them."""
    trackers = {}
    for name in names:
        tracker = keras.metrics.Mean(name=name)
        setattr(model, f"_{name}_tracker", tracker)
        trackers[name] = tracker
    return trackers


def reduce_tracked_loss(model: keras.Model, per_example: dict, sample_weight=None, total=None):
    """The loss ``compute_loss`` returns, from per-example values: every entry of ``per_example``
    (``loss``, the total, and its parts) reduced as Keras reduces a loss with ``sample_weight``
    (:func:`tfhash.losses.reduce_parts`; ``total`` combines the reduced parts into the loss), the
    parts logged by ``model._trackers``, and the total divided by the number of replicas in sync,
    as Keras's losses do under ``tf.distribute`` (the replicas' gradients are summed)."""
    reduced = reduce_parts(per_example, unpack_sample_weight(sample_weight), total)
    for name, tracker in model._trackers.items():
        tracker.update_state(reduced[name])
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return reduced["loss"] / replicas if replicas > 1 else reduced["loss"]


class NestedConfigMixin:
    """``get_config`` / ``from_config`` for models whose constructor takes Keras objects (a
    backbone, a dict of backbones, sub-models): ``nested_keys`` names those arguments, and
    :meth:`config_params` returns the plain ones."""

    nested_keys: tuple[str, ...] = ()

    def config_params(self) -> dict:
        raise NotImplementedError

    def get_config(self):
        nested = {}
        for key in self.nested_keys:
            value = getattr(self, key)
            if isinstance(value, dict):
                nested[key] = {name: keras.saving.serialize_keras_object(obj) for name, obj in value.items()}
            else:
                nested[key] = keras.saving.serialize_keras_object(value)
        return {**super().get_config(), **nested, **self.config_params()}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in cls.nested_keys:
            value = config[key]
            if isinstance(value, dict) and "class_name" not in value:
                config[key] = {name: keras.saving.deserialize_keras_object(obj) for name, obj in value.items()}
            else:
                config[key] = keras.saving.deserialize_keras_object(value)
        return cls(**config)
