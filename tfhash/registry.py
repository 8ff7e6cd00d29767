"""The methods tfhash trains, one entry each: its name, its builder and what it needs, and the one
model builder, :func:`build_model`, which makes a training spec's backbones and method.

The pipeline's config validation and Trainer, the recipes, the Tuner, the command line and the
benchmarks all read this table and build through :func:`build_model`, so a method is known everywhere
by one name, adding one is one :func:`register_method` call beside its model, and named settings of
a method (:data:`VARIANTS`) are stated once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the table itself imports no TensorFlow: `tfhash methods` and config checks start fast
    import keras

    from tfhash.towers import Tower
    from tfhash.training_spec import TrainingSpec

__all__ = ["Method", "BuildInputs", "TagStatistics", "register_method", "unregister_method", "get_method", "method_names",
           "build_method", "build_model", "make_backbone", "image_network", "VARIANTS", "variant", "mean_teacher_rows"]


@dataclass(frozen=True)
class TagStatistics:
    """Label statistics of the training rows: their number and the ``(C, C)`` co-occurrence counts
    ``sum_n t_ni t_nj`` (diagonal: each tag's count), as the pipeline's Transform computes them."""

    count: int
    cooccurrence: np.ndarray

    @classmethod
    def of_labels(cls, labels: np.ndarray) -> TagStatistics:
        """The statistics of ``(n, C)`` multi-hot (or one-hot) labels."""
        tags = (np.asarray(labels) > 0).astype(np.float64)
        return cls(len(tags), tags.T @ tags)

    @property
    def multi_label(self) -> bool:
        """Some row has two tags (off-diagonal co-occurrence)."""
        counts = np.diag(self.cooccurrence)
        return bool(np.any(self.cooccurrence - np.diag(counts) > 0))

    @property
    def frequencies(self) -> np.ndarray:
        """Each tag's share of the rows."""
        return np.diag(self.cooccurrence) / max(self.count, 1)


@dataclass(frozen=True)
class BuildInputs:
    """What a builder may use. ``backbone(modality)`` returns a new backbone for one of
    ``modalities`` (called twice for the two models of MT-SCDH); ``statistics``: the training
    labels' :class:`TagStatistics`, given to methods with ``needs_tag_statistics``."""

    backbone: Callable[[str], keras.Model]
    modalities: Sequence[str]
    num_classes: int
    bits: int
    seed: int = 0
    preset: str | None = None
    statistics: TagStatistics | None = None

    @property
    def single_backbone(self) -> keras.Model:
        if len(self.modalities) != 1:
            raise ValueError(f"this method reads one input; got modalities {list(self.modalities)}")
        return self.backbone(self.modalities[0])


@dataclass(frozen=True)
class Method:
    """One method.

    A builder takes a :class:`BuildInputs` (what any method may draw on: a fresh backbone per
    modality, C, K, the seed, a preset, the training labels' tag statistics) plus the method's own
    options, and returns a compiled-ready Keras model.

    Args:
        name: its one name (config files, command line, benchmarks).
        label: how reports print it.
        build: ``build(inputs: BuildInputs, **options) -> keras.Model``.
        cross_modal: two inputs, one tower each (``modalities`` in the pipeline config).
        needs_tag_statistics: the builder uses the training labels' tag statistics.
        label_coefficients: accepts JCCH's per-example ``q`` / ``u`` targets.
        semi_supervised: trains on unlabelled rows too (all-zero labels).
        in_pipeline: the TFX pipeline trains it (the others need inputs the pipeline does not
            make: unlabelled rows, the training set's row index).
        training_data: ``training_data(x, labels, seed, options) -> (options, fit x, fit y)``:
            what the method needs from in-memory training rows beyond its settings (builder
            options drawn from the rows, rows rearranged, targets extended); None: the rows as
            they are. ``labels`` are ``(n, C)`` multi-hot floats.
    """

    name: str
    label: str
    build: Callable[..., keras.Model]
    cross_modal: bool = False
    needs_tag_statistics: bool = False
    label_coefficients: bool = False
    semi_supervised: bool = False
    in_pipeline: bool = True
    training_data: Callable[..., tuple] | None = None

    def prepare(self, x, labels: np.ndarray, seed: int, options: dict) -> tuple[dict, object, object]:
        """``(builder options, fit inputs, fit targets)`` of this method for in-memory rows ``x``
        with ``(n, C)`` multi-hot ``labels`` and its ``options`` (:attr:`training_data`)."""
        targets = np.asarray(labels, np.float32)
        if self.training_data is None:
            return dict(options), x, targets
        return self.training_data(x, targets, seed, dict(options))


_METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add ``method`` to the table, one call beside its model::

        register_method(Method("my-method", "MyMethod", build_my_method))

    Raises:
        ValueError: its name is taken.
    """
    if method.name in _METHODS:
        raise ValueError(f"a method named {method.name!r} is already registered")
    _METHODS[method.name] = method
    return method


def unregister_method(name: str) -> None:
    """Remove a method added with :func:`register_method` (tests, plug-ins)."""
    _METHODS.pop(name, None)


def get_method(name: str) -> Method:
    """The method called ``name``; ValueError naming the known ones otherwise."""
    try:
        return _METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose one of {method_names()}") from None


def method_names(**flags) -> tuple[str, ...]:
    """The registered names, in registration order; ``flags`` (e.g. ``in_pipeline=True``) keep
    the methods whose attributes have those values."""
    return tuple(m.name for m in _METHODS.values() if all(getattr(m, k) == v for k, v in flags.items()))


def build_method(name: str, inputs: BuildInputs, **options) -> keras.Model:
    """Build method ``name`` (see :class:`BuildInputs`)."""
    return get_method(name).build(inputs, **options)


def make_backbone(spec: TrainingSpec, shape, name: str = "backbone", tower: Tower | None = None, data_root=None,
                  input_map=()) -> keras.Model:  # fmt: skip
    """The backbone ``spec`` configures for inputs of ``shape`` (one example's): the small CNN
    (images), an MLP (vectors: ``tower``'s widths and input dropout, from :meth:`TrainingSpec.towers`,
    with the fine-tuning settings' dropout, behind the adapted ``input_map`` layers), or an image
    network or encoder (:func:`tfhash.models.image_backbone`, fed the images at their stored size).

    Raises:
        tfhash.models.BackboneError: an image backbone for feature vectors, or as
            :func:`tfhash.models.image_backbone` does.
        ValueError: an MLP without its ``tower``.
    """
    from tfhash.models import mlp, small_cnn

    backbone, tuning = spec.backbone, spec.fine_tuning
    if backbone == "small_cnn":
        return small_cnn(tuple(shape), name=name)
    if backbone == "mlp":
        if tower is None:
            raise ValueError("an mlp backbone is made for one tower: pass tower=spec.towers(modalities)[modality]")
        return mlp(int(shape[0]), tower.hidden, name=name, input_map=input_map, dropout=tuning.dropout,
                   input_dropout=tower.input_dropout)  # fmt: skip
    return image_network(backbone, shape, tuning, size=spec.image_size, weights=spec.backbone_weights, data_root=data_root, name=name)


def image_network(backbone: str, shape, tuning, size: int | None = None, weights: str | None = "imagenet", data_root=None,
                  name: str = "backbone") -> keras.Model:  # fmt: skip
    """Image network or encoder ``backbone`` for images stored as ``shape`` (``(H, W[, 3])``), at
    ``size`` with ``weights``, with the augmentation, batch-norm freeze and feature dropout of
    ``tuning`` (a :class:`tfhash.fine_tuning.FineTuning`): :func:`make_backbone`'s image branch,
    and what ``FineTuning.fit`` trains.

    Raises:
        tfhash.models.BackboneError: vectors instead of images, or as
            :func:`tfhash.models.image_backbone` does.
    """
    from tfhash.models import BackboneError, image_backbone

    if len(shape) not in (2, 3):
        raise BackboneError(f"backbone {backbone!r} takes images, but this input holds vectors of shape {list(shape)}; use mlp")
    return image_backbone(backbone, shape, size=size, weights=weights, data_root=data_root, name=name, **tuning.backbone_options())


def build_model(spec: TrainingSpec, inputs: dict, num_classes: int, *, statistics: TagStatistics | None = None, data_root=None,
                backbone_model=None, input_rows: dict | None = None, options: dict | None = None) -> keras.Model:  # fmt: skip
    """The model ``spec`` trains: its method on one backbone per input (:func:`make_backbone`).
    The one place backbones and :class:`BuildInputs` are made: the Keras API's recipes, the
    pipeline's Trainer, the Tuner's trials and the benchmarks all build here.

    Args:
        inputs: ``{name: shape}`` of one example per input (two entries for a cross-modal method:
            one tower each, named ``backbone_<name>``; one input's is ``backbone``).
        statistics: the training labels' :class:`TagStatistics` (the methods with
            ``needs_tag_statistics`` use them).
        data_root: where an image network's local ImageNet weights are looked for.
        backbone_model: a backbone to build on instead of the configured one (one input: the
            trunk cache's top).
        input_rows: ``{name: training rows}`` to adapt ``spec.input_map`` to, in front of each MLP
            tower (:func:`tfhash.layers.input_map_layers`: the Keras API maps inside the model);
            None: the inputs arrive mapped (the pipeline's Transform maps them).
        options: the method's settings: ``spec.overrides`` (the default), or as
            :meth:`Method.prepare` drew them from in-memory training rows.

    Raises:
        ValueError: as the method's builder does (e.g. sHCLM on single-label data).
    """
    from tfhash.layers.input_maps import input_map_layers

    towers = spec.towers(inputs)

    def backbone(modality: str):
        if backbone_model is not None:
            return backbone_model
        name = f"backbone_{modality}" if len(inputs) > 1 else "backbone"
        maps = () if input_rows is None else input_map_layers(towers[modality].input_map, input_rows[modality], spec.seed, name=name)
        return make_backbone(spec, inputs[modality], name, towers[modality], data_root, maps)

    build = BuildInputs(backbone, list(inputs), num_classes, spec.bits, seed=spec.seed, preset=spec.preset, statistics=statistics)
    return build_method(spec.method, build, **(spec.overrides if options is None else options))


#: Named settings of a method that the Tuner searches and the benchmarks report, one entry each:
#: name -> (registered method, its options over the defaults).
VARIANTS: dict[str, tuple[str, dict]] = {
    "shclm triplet 1": ("shclm", {"triplet_weight": 1.0}),
    "shclm triplet 2": ("shclm", {"triplet_weight": 2.0}),
    "hclm triplet 2 pairwise 1": ("hclm", {"triplet_weight": 2.0, "pairwise_weight": 1.0}),
    "hyp2 beta 4 labelled": ("hyp2", {"beta": 4.0, "pair_scope": "labelled"}),
    "hyp2 beta 8 labelled": ("hyp2", {"beta": 8.0, "pair_scope": "labelled"}),
    "jcch beta 0.1": ("jcch", {"beta": 0.1}),
    "jcch fixed centres beta 0": ("jcch", {"fixed_centres": 0.5, "beta": 0.0}),
}


def variant(name: str) -> tuple[str, dict]:
    """``(method, options)`` of ``name``: a :data:`VARIANTS` entry or a registered method (its
    defaults); ValueError naming both tables otherwise."""
    if name in VARIANTS:
        method, options = VARIANTS[name]
        return method, dict(options)
    if name in _METHODS:
        return name, {}
    raise ValueError(f"unknown method or variant {name!r}; choose one of {method_names() + tuple(VARIANTS)}")


# --- the library's methods -----------------------------------------------------------------------


def _scdh(inputs: BuildInputs, ablation: bool = False, **options):
    from tfhash.models import build_scdh

    return build_scdh(inputs.single_backbone, inputs.num_classes, inputs.bits, preset=inputs.preset, ablation=ablation, **options)


def _mt_scdh(inputs: BuildInputs, sample_input=None, **options):
    from tfhash.models import build_mt_scdh

    if sample_input is None:
        raise ValueError("mt-scdh needs sample_input, a small batch of inputs that builds both models")
    (modality,) = inputs.modalities
    return build_mt_scdh(lambda: inputs.backbone(modality), inputs.num_classes, inputs.bits, sample_input,
                         preset=inputs.preset, **options)  # fmt: skip


def _jcch(inputs: BuildInputs, **options):
    from tfhash.models import build_jcch

    backbones = {modality: inputs.backbone(modality) for modality in inputs.modalities}
    return build_jcch(backbones, inputs.num_classes, inputs.bits, preset=inputs.preset, seed=inputs.seed, **options)


def _hclm(inputs: BuildInputs, similarity: np.ndarray | None = None, **options):
    """HCLM / sHCLM: on multi-label statistics the balanced BCE takes their tag frequencies;
    sHCLM assigns proxies by ``similarity`` (given, e.g. class-mean features, HCLM Eq. 19-20) or by
    tag co-occurrence (HCLM Eq. 21), which single-label statistics do not carry."""
    from tfhash.models import build_hclm

    statistics = inputs.statistics
    multi_label = statistics is not None and statistics.multi_label
    frequencies = statistics.frequencies if multi_label else None
    return build_hclm(inputs.single_backbone, inputs.num_classes, inputs.bits, similarity=similarity, seed=inputs.seed,
                      tag_frequencies=frequencies, **options)  # fmt: skip


def _shclm(inputs: BuildInputs, similarity: np.ndarray | None = None, **options):
    from tfhash.proxies import cooccurrence_similarity

    if similarity is None:
        if inputs.statistics is None:
            raise ValueError("shclm needs the tag statistics of the training labels, or a class similarity")
        if not inputs.statistics.multi_label:
            raise ValueError("shclm assigns proxies by tag co-occurrence, which needs multi-label training labels; these "
                             "are single-label: pass a class similarity (tfhash.proxies.class_mean_similarity) or use hclm")  # fmt: skip
        similarity = cooccurrence_similarity(inputs.statistics.cooccurrence)
    return _hclm(inputs, similarity=similarity, **options)


def _hyp2(inputs: BuildInputs, **options):
    from tfhash.models import build_hyp2

    return build_hyp2(inputs.single_backbone, inputs.num_classes, inputs.bits, **options)


def _pairwise(inputs: BuildInputs, num_train: int | None = None, **options):
    from tfhash.models import build_pairwise

    if num_train is None:
        raise ValueError("dpsh needs num_train, the number of training rows (its targets carry each row's index)")
    return build_pairwise(inputs.single_backbone, inputs.num_classes, inputs.bits, num_train, **options)


def _softmax_codes(inputs: BuildInputs, **options):
    from tfhash.models import build_softmax_codes

    return build_softmax_codes(inputs.single_backbone, inputs.num_classes, inputs.bits, seed=inputs.seed, **options)


# --- what methods draw from in-memory training rows (Method.training_data) -----------------------


def mean_teacher_rows(x_labelled, y_labelled, unlabelled, seed: int, labelled_share: float = 0.5):
    """Labelled rows repeated until they are about ``labelled_share`` of the rows, plus the
    unlabelled rows with all-zero labels (MT-SCDH's marker for "no label"), shuffled with
    ``seed``. Mean Teacher keeps a fixed labelled share per batch; repeating the labelled rows is
    our way of doing that with ``fit``'s shuffling."""
    repeats = max(1, int(round(labelled_share * len(unlabelled) / ((1 - labelled_share) * len(x_labelled)))))
    x = np.concatenate([np.tile(x_labelled, (repeats, 1)), unlabelled])
    y = np.concatenate([np.tile(y_labelled, (repeats, 1)), np.zeros((len(unlabelled), y_labelled.shape[1]), "float32")])
    order = np.random.default_rng(seed).permutation(len(x))
    return x[order], y[order]


def _mt_scdh_data(x, targets, seed, options):
    """The labelled rows repeated to about half of the rows beside the unlabelled ones (all-zero
    label rows; :func:`mean_teacher_rows`), or the rows as they are when every row is labelled; a
    sample batch to build the two models; the ``noise`` option (a share of the labelled rows'
    standard deviation, as :data:`tfhash.recipes.MEAN_TEACHER` states it) as ``noise_stddev``."""
    labelled = targets.sum(axis=1) > 0
    if "noise" in options:
        options["noise_stddev"] = float(options.pop("noise")) * float(x[labelled].std())
    if not labelled.all():
        x, targets = mean_teacher_rows(x[labelled], targets[labelled], x[~labelled], seed)
    return {**options, "sample_input": x[:2]}, x, targets


def _shclm_data(x, targets, seed, options):
    """On single-label rows, proxies assigned by class-mean similarity of the features (HCLM
    Eq. 19-20), unless ``options`` give a similarity."""
    from tfhash.proxies import class_mean_similarity

    if "similarity" not in options and (targets.sum(axis=1) == 1).all():
        options["similarity"] = class_mean_similarity(x, targets)
    return options, x, targets


def _dpsh_data(x, targets, seed, options):
    """The number of training rows, and targets carrying each row's index."""
    return {**options, "num_train": len(targets)}, x, {"labels": targets, "index": np.arange(len(targets))}


register_method(Method("scdh", "SCDH", _scdh, label_coefficients=True))
register_method(Method("scdh-s", "SCDH-S", lambda inputs, **options: _scdh(inputs, ablation=True, **options),
                       label_coefficients=True))  # fmt: skip
register_method(Method("mt-scdh", "MT-SCDH", _mt_scdh, semi_supervised=True, in_pipeline=False, training_data=_mt_scdh_data))
register_method(Method("jcch", "JCCH", _jcch, cross_modal=True, label_coefficients=True))
register_method(Method("hclm", "HCLM", _hclm, needs_tag_statistics=True))
register_method(Method("shclm", "sHCLM", _shclm, needs_tag_statistics=True, training_data=_shclm_data))
register_method(Method("hyp2", "HyP2", _hyp2))
register_method(Method("dpsh", "DPSH-style pairwise", _pairwise, in_pipeline=False, training_data=_dpsh_data))
register_method(Method("cnnbh", "CNNBH-style softmax", _softmax_codes, in_pipeline=False))
