"""EfficientNet-Lite (Tan & Le 2019; Google's Lite variants: no squeeze-excitation, ReLU6, fixed
stem and head) in Keras, with ImageNet weights from a PyTorch state dict read without PyTorch
(:mod:`tfhash.state_dicts`).

The blocks come from :func:`tfhash.networks.efficientnet_lite_blocks` (one statement of the
architecture, also what names the cut points before TensorFlow loads).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import keras
import numpy as np

from tfhash.networks import EFFICIENTNET_LITE, LITE_HEAD, LITE_STEM, efficientnet_lite_blocks

__all__ = ["BN_EPSILON", "COUNTER", "efficientnet_lite", "assign_state_dict", "depthwise_dtype"]


#: Batch normalisation's epsilon in the Lite networks.
BN_EPSILON = 1e-3
#: The state dict's batch-norm counters, which carry no weights.
COUNTER = "num_batches_tracked"
#: A block's weighted layers: ``{state dict name: Keras name after "block{i}_"}``.
_BLOCK_PARTS = {"_expand_conv": "expand", "_bn0": "expand_bn", "_depthwise_conv": "depthwise", "_bn1": "depthwise_bn",
                "_project_conv": "project", "_bn2": "project_bn"}  # fmt: skip


def _conv_bn(x, conv: keras.layers.Layer, bn: str, relu: str | None):
    """``conv`` then batch normalisation named ``bn`` then, when ``relu`` names it, ReLU6."""
    x = keras.layers.BatchNormalization(epsilon=BN_EPSILON, name=bn)(conv(x))
    return keras.layers.ReLU(6.0, name=relu)(x) if relu else x


def depthwise_dtype() -> str | None:
    """The depthwise convolutions' dtype policy: float32 under the global ``mixed_bfloat16`` policy
    (the rest of the network keeps bfloat16), else the global policy (None).

    TensorFlow's CPU kernels for bfloat16 depthwise convolutions (5x5 and strided ones above all,
    forward and gradient) are several times slower than float32's: on an Intel Xeon with AMX-BF16
    the depthwise layers of EfficientNet-Lite0 above ``block7`` at 128 px took 730 ms of a training
    step in bfloat16 against 167 ms in float32, and the whole step 1,009 ms against 330-427 ms with
    float32 depthwise layers (batch 64). Depthwise layers hold little of the arithmetic, which
    stays in bfloat16 in the pointwise convolutions.
    """
    return "float32" if keras.mixed_precision.global_policy().compute_dtype == "bfloat16" else None


def _pointwise(filters: int, name: str) -> keras.layers.Conv2D:
    return keras.layers.Conv2D(filters, 1, padding="same", use_bias=False, name=name)


def efficientnet_lite(variant: str = "efficientnet_lite0", input_shape: Sequence[int] | None = None, weights: str | None = None,
                      include_top: bool = False, name: str = "network") -> keras.Model:  # fmt: skip
    """EfficientNet-Lite ``variant`` (a key of :data:`tfhash.networks.EFFICIENTNET_LITE`) on RGB
    pixels in 0..255, global-average-pooled to 1280 features (or, with ``include_top``, ImageNet's
    1000 logits).

    Convolutions use TensorFlow's ``padding="same"``, which is what the weights were trained with
    (Google's TF checkpoints, converted to the EfficientNet-PyTorch naming). The network scales
    the pixels as it was trained, ``(x - 127) / 128``, as its first layer.

    The layers are named ``preprocess``; the stem ``stem_conv``, ``stem_bn``, ``stem``; block ``i``
    ``block{i}_expand`` (+ ``_bn``, ``_relu``; absent when the block does not expand),
    ``block{i}_depthwise`` (+ ``_bn``, ``_relu``), ``block{i}_project`` (+ ``_bn``) and its output
    ``block{i}``; ``head_conv``, ``head_bn``, ``head``; ``pool`` (global average) and, with
    ``include_top``, the ImageNet ``classifier`` (logits).

    Args:
        input_shape: ``(side, side, 3)``; default the variant's own side.
        weights: a PyTorch state dict file (``.pth``/``.pt``, read by
            :func:`tfhash.state_dicts.read_state_dict`), a Keras weights file, or None.

    Raises:
        tfhash.state_dicts.CheckpointError: a checkpoint that is unsafe or not a state dict.
        ValueError: a state dict that does not fit the network (:func:`assign_state_dict`).
    """
    if variant not in EFFICIENTNET_LITE:
        raise ValueError(f"unknown EfficientNet-Lite variant {variant!r}; choose one of {sorted(EFFICIENTNET_LITE)}")
    side = EFFICIENTNET_LITE[variant][2]
    inputs = keras.Input(shape=tuple(input_shape or (side, side, 3)), name="image")
    x = keras.layers.Rescaling(1.0 / 128.0, offset=-127.0 / 128.0, name="preprocess")(inputs)
    stem = keras.layers.Conv2D(LITE_STEM, 3, 2, padding="same", use_bias=False, name="stem_conv")
    x = _conv_bn(x, stem, "stem_bn", "stem")
    for i, block in enumerate(efficientnet_lite_blocks(variant)):
        y, b = x, f"block{i}"
        if block.expand != 1:
            y = _conv_bn(y, _pointwise(block.filters_in * block.expand, f"{b}_expand"), f"{b}_expand_bn", f"{b}_expand_relu")
        depthwise = keras.layers.DepthwiseConv2D(block.kernel, block.stride, padding="same", use_bias=False, name=f"{b}_depthwise",
                                                 dtype=depthwise_dtype())
        y = _conv_bn(y, depthwise, f"{b}_depthwise_bn", f"{b}_depthwise_relu")
        y = _conv_bn(y, _pointwise(block.filters_out, f"{b}_project"), f"{b}_project_bn", None)
        x = keras.layers.Add(name=b)([x, y]) if block.skip else keras.layers.Identity(name=b)(y)
    x = _conv_bn(x, _pointwise(LITE_HEAD, "head_conv"), "head_bn", "head")
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    if include_top:
        x = keras.layers.Dense(1000, name="classifier")(x)
    model = keras.Model(inputs, x, name=name)
    if weights is not None:
        if str(weights).endswith((".pth", ".pt")):
            from tfhash.state_dicts import read_state_dict

            assign_state_dict(model, read_state_dict(weights))
        else:
            model.load_weights(weights)
    return model


def _torch_names(model: keras.Model) -> dict[str, str]:
    """``{state dict prefix: Keras layer}`` for every layer of ``model`` that holds weights."""
    names = {"_conv_stem": "stem_conv", "_bn0": "stem_bn", "_conv_head": "head_conv", "_bn1": "head_bn", "_fc": "classifier"}
    layers = {layer.name for layer in model.layers}
    i = 0
    while f"block{i}" in layers:
        names.update({f"_blocks.{i}.{torch}": f"block{i}_{keras_name}" for torch, keras_name in _BLOCK_PARTS.items()})
        i += 1
    return {prefix: layer for prefix, layer in names.items() if layer in layers}


def _keras_arrays(layer, tensors: Mapping[str, np.ndarray], prefix: str) -> tuple[list[np.ndarray], list[str]]:
    """A layer's weights in Keras's order and layout from its state dict tensors, and the names
    of the tensors they came from."""
    if isinstance(layer, keras.layers.BatchNormalization):
        names = [f"{prefix}.{part}" for part in ("weight", "bias", "running_mean", "running_var")]
        return [tensors[name] for name in names], names
    kernel = tensors[f"{prefix}.weight"]
    if isinstance(layer, keras.layers.DepthwiseConv2D):  # (C, 1, k, k) -> (k, k, C, 1)
        return [kernel.transpose(2, 3, 0, 1)], [f"{prefix}.weight"]
    if isinstance(layer, keras.layers.Conv2D):  # (out, in, k, k) -> (k, k, in, out)
        return [kernel.transpose(2, 3, 1, 0)], [f"{prefix}.weight"]
    return [kernel.T, tensors[f"{prefix}.bias"]], [f"{prefix}.weight", f"{prefix}.bias"]  # Dense: (out, in) -> (in, out)


def assign_state_dict(model: keras.Model, state_dict: Mapping[str, np.ndarray]) -> list[str]:
    """Set ``model``'s weights from an EfficientNet-PyTorch state dict and return the names of the
    tensors assigned, each exactly once: every weight of the model comes from the state dict with
    its shape checked, and every tensor of the state dict is used (the batch-norm counters and,
    for a model without its classifier, ``_fc.*`` excepted).

    Raises:
        ValueError: a tensor missing or of another shape, or tensors left over, all named.
    """
    prefixes = _torch_names(model)
    used, problems = [], []
    for prefix, layer_name in prefixes.items():
        layer = model.get_layer(layer_name)
        try:
            arrays, names = _keras_arrays(layer, state_dict, prefix)
        except KeyError as err:
            problems.append(f"{layer_name} needs {err.args[0]}, which the state dict lacks")
            continue
        expected = [tuple(w.shape) for w in layer.weights]
        if [a.shape for a in arrays] != expected:
            problems.append(f"{layer_name}: state dict {prefix} has shapes {[a.shape for a in arrays]}, the layer {expected}")
            continue
        layer.set_weights([a.astype(np.float32) for a in arrays])
        used += names
    weighted = {layer.name for layer in model.layers if layer.weights}
    unmapped = sorted(weighted - set(prefixes.values()))
    ignored = {key for key in state_dict if key.endswith(COUNTER) or ("classifier" not in weighted and key.startswith("_fc."))}
    left = sorted(set(state_dict) - set(used) - ignored)
    if unmapped:
        problems.append(f"layers without weights in the state dict: {unmapped}")
    if left:
        problems.append(f"{len(left)} tensors of the state dict fit no layer: {left[:8]}{' ...' if len(left) > 8 else ''}")
    if problems:
        raise ValueError(f"the state dict does not fit {model.name} ({len(model.layers)} layers): " + "; ".join(problems[:6]))
    return used
