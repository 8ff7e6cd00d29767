"""The image networks tfhash knows by name, and how a run names a backbone and its weights: the
catalogue and its checks, without TensorFlow, so that a pipeline config is checked completely
before anything heavy loads. The networks themselves are built by
:func:`tfhash.models.image_backbone`.

Nothing is ever downloaded: ``weights="imagenet"`` resolves to a local file (SqueezeNet's shared
weights) or fails with a message that says which file to fetch and where to pass it.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field

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
            SqueezeNet v1.1 (:func:`tfhash.models.backbones.squeezenet_network`).
        size: the input side it was trained at (the default ``size`` of ``image_backbone``).
        preprocess: ``"caffe"`` (Caffe-style mean subtraction ahead of the network) or
            ``"included"`` (the network rescales 0..255 pixels itself, as MobileNetV3 and
            EfficientNet do).
        imagenet_file: the shared data file holding its ImageNet weights, or None when only
            ``keras.applications`` would have them (a download, which tfhash refuses).
        options: further keyword arguments of ``constructor``.
        layers: the network's layer names in order (input excluded), when known without building
            it: a trunk cache's cut is then checked with the config (empty: when the network is
            built, by :func:`tfhash.trunk_cache.split_backbone`).
    """

    constructor: str | None
    size: int
    preprocess: str
    imagenet_file: str | None = None
    options: dict = field(default_factory=dict)
    layers: tuple[str, ...] = ()


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
