"""The methods tfhash trains, one entry each: its name, its builder and what it needs.

The pipeline's config validation and Trainer, the command line and the benchmarks all read this
table, so a method is known everywhere by one name, and adding one is one :func:`register_method`
call beside its model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the table itself imports no TensorFlow: `tfhash methods` and config checks start fast
    import keras

__all__ = ["Method", "BuildInputs", "TagStatistics", "register_method", "unregister_method", "get_method", "method_names", "build_method"]


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
    """

    name: str
    label: str
    build: Callable[..., keras.Model]
    cross_modal: bool = False
    needs_tag_statistics: bool = False
    label_coefficients: bool = False
    semi_supervised: bool = False
    in_pipeline: bool = True


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


register_method(Method("scdh", "SCDH", _scdh, label_coefficients=True))
register_method(Method("scdh-s", "SCDH-S", lambda inputs, **options: _scdh(inputs, ablation=True, **options),
                       label_coefficients=True))  # fmt: skip
register_method(Method("mt-scdh", "MT-SCDH", _mt_scdh, semi_supervised=True, in_pipeline=False))
register_method(Method("jcch", "JCCH", _jcch, cross_modal=True, label_coefficients=True))
register_method(Method("hclm", "HCLM", _hclm, needs_tag_statistics=True))
register_method(Method("shclm", "sHCLM", _shclm, needs_tag_statistics=True))
register_method(Method("hyp2", "HyP2", _hyp2))
register_method(Method("dpsh", "DPSH-style pairwise", _pairwise, in_pipeline=False))
register_method(Method("cnnbh", "CNNBH-style softmax", _softmax_codes, in_pipeline=False))
