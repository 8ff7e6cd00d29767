"""Training on a cached frozen trunk: fine-tuning the upper layers of an image network at the
cost of those layers alone.

The layers below a *cut* do not train, so their activations for several augmented *views* of each
training image are computed once and stored (:func:`build_cache`); every epoch then runs only the
layers above the cut and the hash head. That is what makes the papers' long fine-tuning schedules
fit on two CPU cores. The cache is a training device only: the exported model is the whole network
on raw images. Users reach it through :meth:`tfhash.fine_tuning.FineTuning.fit` with
``trunk_cache`` set, which trains with :func:`fit_on_cache`.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass

import keras
import numpy as np

from tfhash import storage
from tfhash.config_keys import check_count
from tfhash.models.backbones import network_node
from tfhash.networks import augmentation_policy
from tfhash.optimizers import compile_fine_tuning

__all__ = ["CacheError", "CacheKey", "Split", "Cache", "layer_names", "split_backbone", "view_transform", "build_cache",
           "open_cache", "fit_on_cache", "head_weights", "mixup_batch", "weights_fingerprint", "data_fingerprint",
           "cache_bytes"]  # fmt: skip

logger = logging.getLogger(__name__)

#: The file names of a cache entry: the activations (``.npy``, shape ``(views, n, *cut shape)``),
#: the labels and the key with its fields.
ACTIVATIONS, LABELS_FILE, META = "activations.npy", "labels.npy", "cache.json"


class CacheError(ValueError):
    """A trunk cache that cannot be built or used as asked: a cut the backbone does not have or
    that does not split it, a cache built for another backbone, image size or data, or one that
    does not fit the disk."""


@dataclass(frozen=True)
class CacheKey:
    """Everything a cache's content depends on; two runs share a cache only when all of it matches.

    Attributes:
        backbone: the backbone's name (or encoder path) as the run names it.
        weights: sha256 of the trunk's weights (the frozen layers' values).
        cut: the layer whose output is stored.
        image_shape: the stored images' shape; ``size``: the side the network runs at.
        views, policy, seed: the views (:func:`view_transform`).
        data: sha256 of the training images and labels, in order.
        compute_dtype: the trunk's compute dtype (float32 or bfloat16).
    """

    backbone: str
    weights: str
    cut: str
    image_shape: tuple
    size: int
    views: int
    policy: str | None
    seed: int
    data: str
    compute_dtype: str

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def mismatches(self, other: CacheKey) -> list[str]:
        """``"field: this vs other"`` for each field that differs."""
        mine, theirs = asdict(self), asdict(other)
        return [f"{name} {theirs[name]!r} (this run: {mine[name]!r})" for name in mine if mine[name] != theirs[name]]


@dataclass(frozen=True)
class Split:
    """A backbone cut in two: ``trunk`` (stored pixels -> the cut's activations, no augmentation)
    and ``top`` (activations -> the backbone's features, with its training-time dropout). ``top``
    shares its layers, and so its weights, with the backbone. ``size``: the side the network runs
    at (None when it takes any)."""

    trunk: keras.Model
    top: keras.Model
    cut: str
    size: int | None


def layer_names(backbone: keras.Model) -> list[str]:
    """The layers a backbone may be cut at (its network's)."""
    network, _, _ = network_node(backbone)
    return [layer.name for layer in network.layers[1:]]


def split_backbone(backbone: keras.Model, cut: str) -> Split:
    """``backbone`` cut after the layer named ``cut``.

    Raises:
        CacheError: no such layer (the nearest names are suggested), or a cut that does not
            separate the network (a skip connection passes over it, as inside a ResNet block:
            cut at a block's output instead).
    """
    network, entry, exit_ = network_node(backbone)
    names = layer_names(backbone)
    if cut not in names:
        near = difflib.get_close_matches(cut, names, n=3, cutoff=0.5)
        raise CacheError(f"the backbone has no layer {cut!r} to cut at{f'; did you mean {near}?' if near else ''} "
                         f"(its layers: {', '.join(names[:12])}{', ...' if len(names) > 12 else ''})")  # fmt: skip
    if cut == names[-1]:
        raise CacheError(f"cutting at the last layer {cut!r} leaves nothing to train above the cut; cut lower")
    cut_output = network.get_layer(cut).output
    try:
        upper = keras.Model(cut_output, network.output, name="upper")
    except ValueError as err:
        raise CacheError(f"cut {cut!r} does not split the network in two ({str(err).splitlines()[0][:200]}): a "
                         "connection passes over it; cut at the output of a block") from err  # fmt: skip
    if network is backbone:
        trunk = keras.Model(backbone.input, cut_output, name="trunk")
        top = upper
    else:
        lower = keras.Model(network.input, cut_output, name="lower")
        trunk = keras.Model(backbone.input, lower(entry), name="trunk")
        inputs = keras.Input(shape=tuple(cut_output.shape[1:]), name="activations")
        features = upper(inputs)
        if exit_ is not backbone.output:  # layers after the network (the feature dropout)
            features = keras.Model(exit_, backbone.output, name="after")(features)
        top = keras.Model(inputs, features, name="top")
    side = network.input.shape[1] if len(network.input.shape) == 4 else None
    return Split(trunk, top, cut, None if side is None else int(side))


def view_transform(view: int, policy: str | None, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """The function that makes view ``view`` of successive batches of stored images: 0, the images;
    1, mirrored; from 2 on, the augmentation ``policy`` of :data:`tfhash.networks.AUGMENTATIONS`
    (random shift and flip, ``"zoom"`` also a random zoom), one draw per image from a generator
    seeded by ``(seed, view)`` that runs on across the batches; without a policy, views 2 and up
    repeat 0 and 1."""
    from tfhash.models.backbones import Augmentation

    if view == 0 or (policy is None and view % 2 == 0):
        return lambda images: images
    if view == 1 or policy is None:
        return lambda images: images[:, :, ::-1]
    augment = Augmentation(policy, seed=int(seed) * 1000 + int(view))
    return lambda images: np.asarray(augment(np.asarray(images, dtype=np.float32), training=True))


def weights_fingerprint(model: keras.Model) -> str:
    """sha256 of a model's weights in order."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()


def data_fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    """sha256 of the training images and labels (shape, dtype and bytes, in order)."""
    digest = hashlib.sha256()
    for array in (np.ascontiguousarray(images), np.ascontiguousarray(labels)):
        digest.update(f"{array.shape}{array.dtype}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def cache_bytes(count: int, views: int, shape) -> int:
    """The size of a cache's activations: ``views * count`` float16 maps of ``shape``."""
    return int(views) * int(count) * int(np.prod(shape)) * 2


@dataclass
class Cache:
    """A built cache: ``activations`` (a read-only memory map, ``(views, n, *shape)`` float16),
    ``labels`` ``(n, C)``, its ``key`` and ``path``."""

    activations: np.ndarray
    labels: np.ndarray
    key: CacheKey
    path: str

    def steps_per_epoch(self, batch_size: int) -> int:
        """The batches in one epoch of :meth:`dataset`, ``ceil(rows / batch_size)``: ``fit``'s
        ``steps_per_epoch`` for that endless stream."""
        return -(-int(self.activations.shape[1]) // int(batch_size))

    def dataset(self, batch_size: int, seed: int, mixup: float = 0.0):
        """An endless ``tf.data`` stream of epochs over the cache, :meth:`steps_per_epoch`
        batches each: the rows reshuffled and one view drawn per row
        each epoch (from ``seed`` and the epoch), in batches of ``(float16 activations, labels)``;
        the rows of a batch are read in file order (memory-map friendly). ``mixup`` > 0 mixes each
        row with a partner of its batch (:func:`mixup_batch`); the targets are then ``{"labels",
        "q", "u"}``.

        Endless, so that ``fit`` keeps one iterator for the whole run: given a dataset of one
        epoch, Keras makes a new iterator each epoch, and freeing the old one (its prefetching
        thread inside this generator) left both cores idle before the next epoch's first step, for
        seconds to over a minute, at one epoch start in five or so (TF 2.16 and Keras 3 on a 2-core
        AMD EPYC)."""
        import tensorflow as tf

        views, count = self.activations.shape[:2]
        epoch = [0]

        def batches():
            rng = np.random.default_rng([int(seed), epoch[0]])
            epoch[0] += 1
            order, chosen = rng.permutation(count), rng.integers(0, views, count)
            for start in range(0, count, batch_size):
                rows = np.sort(order[start:start + batch_size])
                picked = chosen[rows]
                batch = np.empty((len(rows), *self.activations.shape[2:]), np.float16)
                for view in np.unique(picked):
                    batch[picked == view] = self.activations[view, rows[picked == view]]
                if mixup > 0:  # the draws here, the arithmetic in the graph (mixup_batch, below)
                    yield batch, self.labels[rows], rng.beta(mixup, mixup, len(rows)).astype(np.float32), rng.permutation(len(rows))
                else:
                    yield batch, self.labels[rows]

        features = tf.TensorSpec((None, *self.activations.shape[2:]), tf.float16)
        labels = tf.TensorSpec((None, self.labels.shape[1]), tf.as_dtype(self.labels.dtype))
        draws = (tf.TensorSpec((None,), tf.float32), tf.TensorSpec((None,), tf.int64)) if mixup > 0 else ()
        data = tf.data.Dataset.from_generator(batches, output_signature=(features, labels, *draws)).repeat()
        if mixup > 0:
            data = data.map(mixup_batch, num_parallel_calls=tf.data.AUTOTUNE)
        return data.prefetch(2)


def mixup_batch(features, labels, weights, partners):
    """Mixup of a batch (Zhang et al., 2018) as SCUL targets: row i becomes
    ``w_i x_i + (1 - w_i) x_p(i)`` (computed in float32, returned in ``features``' dtype) with
    labels the union of both label sets (of weight > 0) and the SCUL weights of SCDH Eq. 16 mixed
    by the same weight, ``q = w Y_i/|Y_i| + (1 - w) Y_p/|Y_p|`` and ``u = w Y_i + (1 - w) Y_p``,
    so its SCUL is the weighted sum of the two rows' (the classifier term weighs the union's labels
    equally). Tensors in (``weights`` ``(B,)``, ``partners`` ``(B,)`` row indices), tensors out:
    ``(features, {"labels", "q", "u"})``."""
    import tensorflow as tf

    x = tf.convert_to_tensor(features)
    w = tf.cast(weights, tf.float32)
    rows = tf.reshape(w, tf.concat([tf.shape(w), tf.ones([tf.rank(x) - 1], tf.int32)], 0))
    x32 = tf.cast(x, tf.float32)
    mixed = tf.cast(rows * x32 + (1 - rows) * tf.gather(x32, partners), x.dtype)
    own = tf.cast(labels, tf.float32)
    other, w = tf.gather(own, partners), w[:, None]
    share = lambda y: y / tf.maximum(tf.reduce_sum(y, axis=1, keepdims=True), 1.0)  # noqa: E731
    u = w * own + (1 - w) * other
    return mixed, {"labels": tf.cast(u > 0, tf.float32), "q": w * share(own) + (1 - w) * share(other), "u": u}


def open_cache(path: str, key: CacheKey) -> Cache:
    """The cache at ``path``, checked against the ``key`` this run needs.

    Raises:
        CacheError: no complete cache there, or one built for something else (each differing
            field named: another backbone, image size, cut, views or data).
    """
    meta_path = os.path.join(path, META)
    if not os.path.isfile(meta_path):
        raise CacheError(f"{path}: no trunk cache here (no {META}); build one with tfhash.trunk_cache.build_cache")
    with open(meta_path) as handle:
        meta = json.load(handle)
    stored = CacheKey(**{**meta["key"], "image_shape": tuple(meta["key"]["image_shape"])})
    differences = key.mismatches(stored)
    if differences:
        raise CacheError(f"{path}: this trunk cache was built for {'; '.join(differences)}; delete it or let the run "
                         "build its own (a cache directory keeps one entry per key)")  # fmt: skip
    activations = np.load(os.path.join(path, ACTIVATIONS), mmap_mode="r")
    labels = np.load(os.path.join(path, LABELS_FILE))
    if activations.shape[:2] != (key.views, len(labels)) or list(activations.shape) != meta["shape"]:
        raise CacheError(f"{path}: activations of shape {activations.shape} do not match its record {meta['shape']} "
                         "(an interrupted or altered cache); delete it")  # fmt: skip
    return Cache(activations, labels, stored, path)


def build_cache(split: Split, images: np.ndarray, labels: np.ndarray, directory: str, backbone: str,
                views: int = 8, policy: bool | str | None = True, seed: int = 0, batch_size: int = 128) -> Cache:  # fmt: skip
    """The cache of ``split.trunk``'s activations for ``views`` views of ``images``, in
    ``directory/<key digest>``: reused when present, else computed there (written to a temporary
    folder and renamed when complete, so an interrupted build leaves nothing half-made).

    Args:
        split: from :func:`split_backbone`.
        images, labels: the training rows (stored pixels; ``(n, C)`` labels).
        backbone: the backbone's name (or encoder path) as the run names it, for the :class:`CacheKey`.
        views, policy, seed: see :func:`view_transform`.

    Raises:
        CacheError: fewer than one view, or not enough free disk (the bytes needed and free named).
    """
    if int(views) < 1:
        raise CacheError(f"a trunk cache needs at least one view, got views={views}")
    policy = augmentation_policy(policy)
    shape = tuple(int(s) for s in split.trunk.output.shape[1:])
    key = CacheKey(backbone=str(backbone), weights=weights_fingerprint(split.trunk), cut=split.cut,
                   image_shape=tuple(int(s) for s in images.shape[1:]), size=split.size or 0, views=int(views),
                   policy=policy, seed=int(seed), data=data_fingerprint(images, labels),
                   compute_dtype=str(keras.mixed_precision.global_policy().compute_dtype))  # fmt: skip
    path = os.path.join(directory, f"{key.cut}-{key.size}px-{key.digest()}")
    if os.path.isdir(path):
        logger.info("trunk cache: reusing %s", path)
        return open_cache(path, key)
    os.makedirs(directory, exist_ok=True)
    staging = storage.staging_folder(directory, ".building-")  # first: a killed build's leftovers free their space
    try:
        need, free = cache_bytes(len(images), views, shape), shutil.disk_usage(directory).free
        if need > 0.9 * free:
            raise CacheError(f"a trunk cache of {views} views x {len(images)} images x {shape} float16 needs "
                             f"{need / 1e9:.2f} GB, and {directory} has {free / 1e9:.2f} GB free: use fewer views, a lower "
                             "cut or image size, or a cache directory on a larger disk")  # fmt: skip
        logger.info("trunk cache: computing %d views of %d images at the output of %s (%.2f GB) in %s",
                    views, len(images), split.cut, need / 1e9, path)  # fmt: skip
        activations = np.lib.format.open_memmap(os.path.join(staging, ACTIVATIONS), mode="w+", dtype=np.float16,
                                                shape=(int(views), len(images), *shape))  # fmt: skip
        for view in range(int(views)):
            transform = view_transform(view, policy, seed)
            for start in range(0, len(images), batch_size):
                batch = transform(images[start:start + batch_size])
                activations[view, start:start + len(batch)] = np.asarray(split.trunk(batch, training=False), np.float16)
        activations.flush()
        del activations
        np.save(os.path.join(staging, LABELS_FILE), labels)
        with open(os.path.join(staging, META), "w") as handle:
            json.dump({"key": asdict(key), "shape": [int(views), len(images), *shape]}, handle, indent=1)
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return open_cache(path, key)


def head_weights(model: keras.Model) -> list:
    """The variables of a tfhash model outside its backbone (hash head, centres, proxies,
    classifier), in the model's order."""
    inside = {id(v) for v in model.modality_backbone().weights}
    return [v for v in model.weights if id(v) not in inside]


def fit_on_cache(recipe, build, make_backbone, images, labels, *, epochs: int, batch_size: int, seed: int, backbone_name: str,
                 policy: str = "float32", callbacks=(), verbose: int = 2):  # fmt: skip
    """Train a tfhash model on a trunk cache of the fine-tuning ``recipe``'s ``trunk_cache``
    (:class:`tfhash.fine_tuning.FineTuning`; what its ``fit`` does when it is set); returns
    ``(model, history, cache)``: ``model`` is a float32 model on raw images (the full backbone)
    holding the trained weights, ``cache`` the :class:`Cache` trained on.

    The backbone is cut by :func:`split_backbone` into the *trunk* (stored pixels -> the cut's
    activations, in inference mode) and the *top*, which shares its layers with the backbone. The
    cache holds the trunk's activations of ``trunk_cache.views`` copies of the training images
    (view 0: as they are; view 1: mirrored; the others: the recipe's ``augment`` random augmentation,
    seeded), in ``float16`` on disk under a key of everything they depend on (:class:`CacheKey`),
    reused by a later run with the same key. The cached model is compiled with the recipe
    (:func:`tfhash.optimizers.compile_fine_tuning`, the backbone rate on the layers above the cut)
    and trained under ``policy``; the global mixed-precision policy is restored afterwards.

    Args:
        build: backbone -> a tfhash model (a method's builder; one image input).
        make_backbone: a new full backbone (weights loaded), called under ``policy`` and again
            under float32.
        images, labels: the training rows.
        epochs, batch_size, seed: of the cached model's training (the seed also draws the views).
        backbone_name: how the run names the backbone (part of the cache's key).
        policy: ``"float32"`` or ``"mixed_bfloat16"`` for the cache and the training.
        callbacks: Keras callbacks of the cached model's ``fit``, or ``callbacks(split)`` returning
            them (e.g. a validation curve on the trunk's activations of held-out images).
        verbose: as for ``keras.Model.fit``.

    Raises:
        CacheError: no ``trunk_cache`` set; as :func:`split_backbone` and :func:`build_cache`;
            a method with several backbones (cross-modal, Mean Teacher).
        ValueError: ``epochs`` or ``batch_size`` not a positive integer (before the cache is built).
    """
    if recipe.trunk_cache is None:
        raise CacheError("these fine-tuning settings have no trunk_cache; set trunk_cache=True (or its settings) or call fit")
    check_count("fit_on_cache's epochs", epochs)
    check_count("fit_on_cache's batch_size", batch_size)
    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(policy)
    try:
        backbone = make_backbone()
        settings = recipe.trunk_cache
        split = split_backbone(backbone, settings.cut)
        cached = build(split.top)  # refused before the cache costs anything
        if len(cached.modalities) != 1 or cached.modality_backbone() is not split.top:
            raise CacheError(f"{type(cached).__name__} trains several backbones; the trunk cache serves models with one "
                             "image backbone (not cross-modal or Mean-Teacher models)")  # fmt: skip
        if settings.mixup and not hasattr(cached, "clusters"):
            raise CacheError(f"trunk_cache.mixup mixes SCUL's label weights; {type(cached).__name__} has no semantic "
                             "clusters (use it with SCDH, or set mixup to 0)")  # fmt: skip
        cache = build_cache(split, images, labels, settings.directory, backbone_name, settings.views, recipe.augment, seed)
        steps = cache.steps_per_epoch(batch_size)
        compile_fine_tuning(cached, recipe, int(epochs), steps)
        callbacks = callbacks(split) if callable(callbacks) else list(callbacks)
        history = cached.fit(cache.dataset(int(batch_size), seed, settings.mixup), epochs=int(epochs), steps_per_epoch=steps,
                             callbacks=callbacks, verbose=verbose)  # fmt: skip
    finally:
        keras.mixed_precision.set_global_policy(previous)
    keras.mixed_precision.set_global_policy("float32")
    try:
        full_backbone = make_backbone()
        model = build(full_backbone)
        model(keras.ops.zeros((1, *images.shape[1:]), images.dtype), training=False)  # creates the head's variables
    finally:
        keras.mixed_precision.set_global_policy(previous)
    full_backbone.set_weights(backbone.get_weights())
    source, target = head_weights(cached), head_weights(model)
    if [tuple(v.shape) for v in source] != [tuple(v.shape) for v in target]:
        raise CacheError("the model built on the full backbone does not have the cached model's head; "
                         "the builder must build the same model for any backbone")  # fmt: skip
    for src, dst in zip(source, target, strict=True):
        dst.assign(keras.ops.cast(src, dst.dtype))
    return model, history, cache
