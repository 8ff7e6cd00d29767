"""The search over image recipes ("single-label photos"): the fine-tuning settings of one pretrained
image network chosen on a validation split of the user's own training images.

Every trial trains the layers above the network's cut on one trunk cache (:mod:`tfhash.trunk_cache`):
the frozen layers' activations of the training images are computed once, by the first trial, and
every later trial reads them, so a trial costs only the layers above the cut. The network, its side,
its cut and the cached views are the base spec's and stay fixed; the space searches what trains
above them (:class:`PhotoSpace`). Hyperband's fidelity is the share of the recipe's epochs a trial
trains, as for feature vectors (:class:`tfhash.tuning.Budget`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tfhash.networks import OTHER_BACKBONES
from tfhash.recipes import SHORT_PHOTO_LOSS
from tfhash.registry import get_method, variant
from tfhash.training_spec import PHOTOS, TrainingSpec
from tfhash.tuning.search import (
    Budget,
    TuneResult,
    TuningError,
    TuningTask,
    carve_validation,
    hyperparameters_of,
)

__all__ = ["PHOTO_BUDGET", "PhotoSpace", "PhotoTask", "PhotoTuneResult", "prepare_photos", "fit_photos", "check_images"]

#: The default budget of a search over image recipes: Hyperband over 3 units (3 trials at a third of
#: their epochs, the best of them and 2 more at full fidelity) beside the base spec's full training,
#: 5 trainings of one recipe in all (:meth:`Budget.multiple`), the trunk cache built once.
PHOTO_BUDGET = Budget(max_units=3)


@dataclass(frozen=True)
class PhotoSpace:
    """The settings a search over image recipes draws from; the first value of each is the one a
    space without a default starts from.

    Args:
        methods: ``{variant: (registered method, its options)}`` (:data:`tfhash.registry.VARIANTS`):
            by default SCDH and HCLM with the triplet and pairwise terms, the losses the recommended
            recipe takes for long and short codes (:func:`tfhash.recipes.recommended_photos`).
        mixup: the trunk cache's mixup (:class:`tfhash.fine_tuning.TrunkCacheSettings`; 0 is off);
            it mixes SCDH's label weights, so a method without them (HCLM) trains without mixup.
        learning_rate_scale, backbone_rate_scale: factors on the base spec's rate for the new layers
            and on its rate for the pretrained layers above the cut (its ``learning_rate`` where it
            has no ``backbone_learning_rate``; :class:`tfhash.fine_tuning.FineTuning`). Factors, not
            rates, so that one space suits the base's optimizer, whose good rates differ by tenfold
            (SGD 0.01 / 0.005 and Adam 0.001 / 0.0001 above Lite1's ``block10``).
        dropout: dropout on the network's feature vector.
        schedule: the rate's schedule (``"step"``: cut by ``decay_rate`` at 60% and 80% of the
            epochs; ``"cosine"``: to 0 over them).
        epochs: the recipe's epochs (a trial of ``u`` units trains ``u / max_units`` of them).
    """

    methods: dict[str, tuple[str, dict]] = field(default_factory=lambda: {name: variant(name) for name in ("scdh", SHORT_PHOTO_LOSS)})
    mixup: tuple[float, ...] = (0.4, 0.0)
    learning_rate_scale: tuple[float, ...] = (1.0, 3.0)
    backbone_rate_scale: tuple[float, ...] = (1.0, 0.4, 2.0)
    dropout: tuple[float, ...] = (0.5, 0.2)
    schedule: tuple[str, ...] = ("cosine", "step")
    epochs: tuple[int, ...] = (40, 60, 20)

    def choices(self) -> dict[str, tuple]:
        """``{hyperparameter name: values}`` as KerasTuner holds them."""
        return {"variant": tuple(self.methods), "mixup": self.mixup, "learning_rate_scale": self.learning_rate_scale,
                "backbone_rate_scale": self.backbone_rate_scale, "dropout": self.dropout, "schedule": self.schedule,
                "epochs": self.epochs}  # fmt: skip

    def hyperparameters(self, default: TrainingSpec | None = None):
        """The space as ``keras_tuner.HyperParameters``, each setting's default ``default``'s value
        where the space holds it (:func:`tfhash.tuning.search.hyperparameters_of`)."""
        return hyperparameters_of(self.choices(), {} if default is None else self.values_of(default))

    def values_of(self, spec: TrainingSpec) -> dict:
        """The hyperparameter values of ``spec`` (the inverse of :meth:`spec`); a method that is no
        variant of the space has none (its trial then starts from the space's first)."""
        tuning = spec.fine_tuning
        variants = [v for v, (name, options) in self.methods.items() if (name, options) == (spec.method, spec.overrides)]
        return {**({"variant": variants[0]} if variants else {}), "mixup": tuning.trunk_cache.mixup,
                "learning_rate_scale": 1.0, "backbone_rate_scale": 1.0,
                "dropout": tuning.dropout, "schedule": tuning.schedule, "epochs": spec.epochs}  # fmt: skip

    def around(self, spec: TrainingSpec) -> PhotoSpace:
        """This space with ``spec``'s own value put first in every setting that lacks it, so that a
        search from ``spec`` trains ``spec`` itself first (its method stays as the space's
        variants have it)."""
        values = self.values_of(spec)
        return replace(self, **{name: (values[name], *held) for name, held in self.choices().items()
                                if name != "variant" and values[name] not in held})  # fmt: skip

    def spec(self, values: dict, base: TrainingSpec) -> TrainingSpec:
        """``base`` with the settings of hyperparameter ``values`` (KerasTuner's own ``tuner/...``
        entries and ``kind`` are ignored): the one reading of a search's result, by the library and
        the pipeline's Trainer.

        Raises:
            ValueError: ``values`` without a setting of this space (a search made by another
                version of tfhash, e.g. rates before they were factors), or an unknown variant.
        """
        missing = sorted(set(self.choices()) - set(values))
        if missing or values["variant"] not in self.methods:
            raise ValueError(f"these hyperparameters do not read as a photo recipe of this space: missing {missing}, variant "
                             f"{values.get('variant')!r} of {sorted(self.methods)} (given: {sorted(values)}); a search made by "
                             "another tfhash version: run the search again")  # fmt: skip
        method, options = self.methods[values["variant"]]
        mixup = float(values["mixup"]) if get_method(method).label_coefficients else 0.0
        tuning = base.fine_tuning
        above = tuning.learning_rate if tuning.backbone_learning_rate is None else tuning.backbone_learning_rate
        tuning = replace(tuning, learning_rate=tuning.learning_rate * float(values["learning_rate_scale"]),
                         backbone_learning_rate=above * float(values["backbone_rate_scale"]),
                         dropout=float(values["dropout"]), schedule=str(values["schedule"]), decay_epochs=[],
                         trunk_cache=replace(tuning.trunk_cache, mixup=mixup))  # fmt: skip
        return replace(base, method=method, overrides=dict(options), epochs=int(values["epochs"]), fine_tuning=tuning)


def check_images(images, labels) -> np.ndarray:
    """``images`` as pixels ``(n, H, W[, 1 or 3])``: uint8, or floats in 0-255 (the pipeline's
    transformed images, :data:`tfhash.export.IMAGE_RANGE`), one per row of ``labels``.

    Raises:
        ValueError: another dtype or shape, a value that is not finite or out of range, or a row
            count unlike the labels'.
    """
    images = np.asarray(images)
    if images.ndim not in (3, 4) or (images.ndim == 4 and images.shape[-1] not in (1, 3)) or images.dtype.kind not in "uf":
        raise ValueError(f"photos are pixels (n, H, W) or (n, H, W, 1 or 3), uint8 or floats in 0-255; got {images.dtype} "
                         f"{images.shape} (decode files with tfhash.data.user, or pass feature vectors with another kind)")  # fmt: skip
    if images.dtype.kind == "f" and not (np.isfinite(images).all() and images.min(initial=0) >= 0 and images.max(initial=0) <= 255):
        bad = int((~np.isfinite(images) | (images < 0) | (images > 255)).reshape(len(images), -1).any(axis=1).argmax())
        raise ValueError(f"photo {bad} holds a pixel that is not a finite value in 0-255 (NaN, infinite or out of range); "
                         "fix or drop it")  # fmt: skip
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} label rows; give one label row per image")
    return images


def fit_photos(spec: TrainingSpec, images, labels: np.ndarray, *, epochs: int | None = None, data_root=None, callbacks=(), verbose: int = 0):
    """Train ``spec`` (an image network, with a trunk cache or end to end: its ``fine_tuning``) on
    ``images`` (:func:`check_images`) and their labels (class ids or ``(n, C)`` one-hot rows); returns the trained float32 model on raw images
    (:meth:`tfhash.fine_tuning.FineTuning.fit`). ``epochs``: instead of the spec's, the schedule
    spanning them."""
    from tfhash.labels import multi_hot
    from tfhash.registry import TagStatistics, build_model

    labels = multi_hot(labels)
    images = check_images(images, labels)
    inputs = {"image": tuple(np.shape(images)[1:])}
    statistics = TagStatistics.of_labels(labels)

    def build(backbone):
        return build_model(spec, inputs, labels.shape[1], statistics=statistics, backbone_model=backbone)

    return spec.fine_tuning.fit(build, images, labels, spec.backbone, spec.epochs if epochs is None else int(epochs),
                                batch_size=spec.batch_size, seed=spec.seed, size=spec.image_size,
                                weights=spec.backbone_weights, precision=spec.mixed_precision, callbacks=callbacks,
                                data_root=data_root, verbose=verbose)  # fmt: skip


@dataclass
class PhotoTask(TuningTask):
    """A :class:`tfhash.tuning.TuningTask` over images: each trial trains ``base`` with its values
    (:meth:`PhotoSpace.spec`) on the training part of the split, above the trunk cache in
    ``base``'s directory that the first trial builds and the others read."""

    base: TrainingSpec | None = None
    data_root: object = None

    def train(self, values: dict, epochs: int, callbacks: list):
        spec = self.space.spec(values, self.base)
        train = self.split.train
        return fit_photos(spec, self.x[train], self.labels[train], epochs=epochs, data_root=self.data_root, callbacks=callbacks)


@dataclass
class PhotoTuneResult(TuneResult):
    """What a search over image recipes chose: :attr:`recipe` is the chosen
    :class:`tfhash.training_spec.TrainingSpec` (the base spec with the chosen settings)."""

    def fit(self, x, labels, unlabelled=None, **kwargs):
        """Train :attr:`recipe` on all ``x`` (photos) and ``labels``; ``kwargs`` as
        :func:`fit_photos` takes them.

        Raises:
            ValueError: unlabelled rows (the search trained on labelled images only), or as
                :func:`fit_photos`.
        """
        if unlabelled is not None:
            raise ValueError(f"the chosen recipe ({self.recipe.method} on {self.recipe.backbone}) trains on labelled images only: "
                             "drop unlabelled")  # fmt: skip
        return fit_photos(self.recipe, x, labels, **kwargs)


def prepare_photos(images, labels: np.ndarray, base: TrainingSpec, budget: Budget | None = None, *, space: PhotoSpace | None = None,
                   cache_dir: str, train_in_database: float, data_root=None) -> tuple[PhotoTask, TrainingSpec]:  # fmt: skip
    """The task of a search over image recipes and its default spec (``base``, trained first at full
    fidelity and kept unless beaten); ``labels`` ``(n, C)`` single-label rows.

    Raises:
        TuningError: a ``base`` that does not train an image network above a trunk cache, or
            multi-label rows.
        ValueError: as :func:`check_images`.
    """
    images = check_images(images, labels)
    if base.backbone in OTHER_BACKBONES or base.fine_tuning.trunk_cache is None:
        raise TuningError(f"the search over image recipes trains a pretrained image network above a trunk cache; the base "
                          f"spec trains backbone {base.backbone!r} with trunk_cache {base.fine_tuning.trunk_cache}: name an "
                          "ImageNet network (e.g. efficientnet_lite0) with fine_tuning.trunk_cache set")  # fmt: skip
    if bool((labels.sum(axis=1) > 1).any()):
        raise TuningError(f"{PHOTOS!r} are single-label images; these labels give some rows several classes")
    cache = base.fine_tuning.trunk_cache
    if cache.directory is None:  # every trial reads the one cache the first builds
        base = replace(base, fine_tuning=replace(base.fine_tuning, trunk_cache=replace(cache, directory=cache_dir)))
    space = (PhotoSpace() if space is None else space).around(base)
    task = PhotoTask(x=images, labels=labels, split=carve_validation(labels, base.seed, train_in_database=train_in_database),
                     kind=PHOTOS, bits=base.bits, seed=base.seed, space=space, budget=PHOTO_BUDGET if budget is None else budget,
                     base=base, data_root=data_root)  # fmt: skip
    return task, base
