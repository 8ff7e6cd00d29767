"""SavedModel export of a trained tfhash model for TF Serving (stock TF ops only).

The SavedModel's signatures take serialized tf.Examples, the model input as a tensor or, for
images, raw pixels, and return the codes (:func:`export_serving_model`). Every signature checks
its inputs before the model runs (:class:`ServingModule`).
"""

from __future__ import annotations

import tensorflow as tf

from tfhash import storage
from tfhash.artifacts import (
    EXAMPLES_INPUT,
    EXAMPLES_SIGNATURE,
    NOT_MODEL_INPUTS,
    PIXELS_INPUT,
    WARMUP_FILE,
    code_outputs,
    examples_signature,
    features_signature,
    modality_spec,
    pixels_signature,
)

__all__ = ["export_feature_model", "export_image_model", "export_serving_model", "IMAGE_RANGE", "DEFAULT_VALUE_BOUND"]

#: Inputs of unknown range are bounded by +-this: beyond it float32 arithmetic in the first layers
#: overflows or loses the input, so such values are refused instead of encoded.
DEFAULT_VALUE_BOUND = 1e6
#: Decoded 8-bit images (the Transform's pixels, float 0..255).
IMAGE_RANGE = (0.0, 255.0)


def finite_features(parsed: dict) -> dict:
    """Parsed tf.Example features with every float tensor (dense, sparse or ragged) checked finite
    (``CheckNumerics``: InvalidArgumentError naming the feature)."""

    def check(name, tensor):
        if not tensor.dtype.is_floating:
            return tensor
        message = f"feature {name!r} holds NaN or infinite values"
        if isinstance(tensor, tf.SparseTensor):
            return tf.SparseTensor(tensor.indices, tf.debugging.check_numerics(tensor.values, message), tensor.dense_shape)
        if isinstance(tensor, tf.RaggedTensor):
            return tensor.with_flat_values(tf.debugging.check_numerics(tensor.flat_values, message))
        return tf.debugging.check_numerics(tensor, message)

    return {name: check(name, tensor) for name, tensor in parsed.items()}


def decode_images(encoded: tf.Tensor, shape: list[int]) -> tf.Tensor:
    """Encoded images (PNG or JPEG bytes, ``(batch,)`` or ``(batch, 1)``) -> float32 pixels
    ``(batch, *shape)`` in 0..255; an image of another size raises InvalidArgumentError naming
    the size the model takes."""
    channels = shape[2] if len(shape) == 3 else 1
    expected = [int(shape[0]), int(shape[1]), channels]
    described = "x".join(str(s) for s in expected)

    def decode(one):
        image = tf.io.decode_image(one, channels=channels, expand_animations=False)
        check = tf.debugging.assert_equal(tf.shape(image), tf.constant(expected, tf.int32),
                                          message=f"an image's height x width x channels is not {described}, the size the model takes")  # fmt: skip
        with tf.control_dependencies([check]):
            return tf.cast(tf.reshape(image, shape), tf.float32)

    return tf.map_fn(decode, tf.reshape(encoded, [-1]), fn_output_signature=tf.TensorSpec(shape, tf.float32))


def checked_input(features: tf.Tensor, name: str, shape: list, value_range: tuple) -> tf.Tensor:
    """A model input after the signature's checks: shape ``[batch, *shape]``, finite, within
    ``value_range`` (inclusive); any violation raises InvalidArgumentError before the model runs."""
    low, high = (float(v) for v in value_range)
    features = tf.ensure_shape(features, [None, *shape])
    features = tf.debugging.check_numerics(features, f"input {name!r} holds NaN or infinite values")
    within = tf.reduce_all(tf.logical_and(features >= low, features <= high))
    check = tf.debugging.Assert(within, [f"input {name} holds values outside [{low:g}, {high:g}]; its min and max:",
                                         tf.reduce_min(features), tf.reduce_max(features)])  # fmt: skip
    with tf.control_dependencies([check]):
        return tf.identity(features)


def mirror_averaged(encoder, images):
    """Continuous codes of ``images`` averaged with those of their horizontal mirrors, before the
    sign: ``(F(x) + F(mirror(x))) / 2`` (test-time flip augmentation; images ``(n, H, W)`` or
    ``(n, H, W, C)``, mirrored along the width, axis 2). Twice the encoder's cost per image."""
    return (encoder(images, training=False) + encoder(tf.reverse(images, axis=[2]), training=False)) / 2


class ServingModule:
    """The serving signatures of a Keras model and its Transform layer (:func:`save_serving_module`
    saves them). ``tft_layer`` maps the parsed raw features to the model inputs (the Transform
    graph in the pipeline; any callable of stock TF ops for data that needs no Transform).
    ``inputs``: ``{input name: shape}``, one entry per modality of the model (its
    ``modalities``; a single-input model has one, whatever its name); each input is encoded with
    the model's encoder of that modality (:meth:`tfhash.models.base.EncoderMixin.encoder`).
    ``value_ranges``: ``{input name: (low, high)}``, default +-:data:`DEFAULT_VALUE_BOUND`.
    ``image_inputs``: the inputs that are images, which also get a ``uint8`` pixel signature;
    ``mirrored_inputs``: image inputs encoded with their mirror (:func:`mirror_averaged`).
    ``raw_vectors``: ``{input name: raw shape}`` of vector inputs whose ``encode`` signature takes
    the raw vectors and maps them through ``tft_layer`` (the pipeline's: its Transform maps
    vectors, :mod:`tfhash.components.input_maps`); the raw vectors are checked as model inputs are.

    Input checks inside the signatures (so TF Serving, ``saved_model_cli`` and the search service
    all answer INVALID_ARGUMENT for the same inputs): the float features parsed from tf.Examples
    must be finite (:func:`finite_features`), and every model input must have the declared shape,
    be finite and lie within its value range (:data:`IMAGE_RANGE` for decoded images,
    +-:data:`DEFAULT_VALUE_BOUND` unless told otherwise), checked before the model runs
    (:func:`checked_input`). A NaN is never left to the network: ReLU and max can turn it into a
    number on some CPUs (oneDNN maps an all-NaN input to all-zero codes)."""

    def __init__(self, model, tft_layer, raw_feature_spec: dict, inputs: dict, bits: int, value_ranges: dict | None = None,
                 image_inputs=(), mirrored_inputs=(), raw_vectors: dict | None = None):  # fmt: skip
        if set(mirrored_inputs) - set(image_inputs):
            raise ValueError(f"only image inputs are encoded mirrored; {sorted(set(mirrored_inputs) - set(image_inputs))} are not images")
        self.mirrored = set(mirrored_inputs)
        self.tft_layer = tft_layer
        self.bits = int(bits)
        self.inputs = {name: list(shape) for name, shape in inputs.items()}
        self.value_ranges = {name: tuple((value_ranges or {}).get(name, (-DEFAULT_VALUE_BOUND, DEFAULT_VALUE_BOUND)))
                             for name in self.inputs}  # fmt: skip
        self.spec = {k: v for k, v in raw_feature_spec.items() if k not in NOT_MODEL_INPUTS}
        # Built eagerly: the signatures trace through them.
        self.encoders = {name: model.encoder(name if len(self.inputs) > 1 else None) for name in self.inputs}
        self.serve, self.encode, self.pixels = {}, {}, {}
        for name in image_inputs:
            self.pixels[name] = tf.function(lambda pixels, name=name: self._encode(name, tf.cast(pixels, tf.float32)),
                                            input_signature=[tf.TensorSpec([None, *self.inputs[name]], tf.uint8, name=PIXELS_INPUT)])  # fmt: skip
        self.raw_vectors = {name: list(shape) for name, shape in (raw_vectors or {}).items()}
        for name, shape in self.inputs.items():
            self.serve[name] = tf.function(lambda examples, name=name: self._encode(name, self._parse(examples)[name]),
                                           input_signature=[tf.TensorSpec([None], tf.string, name=EXAMPLES_INPUT)])  # fmt: skip
            self.encode[name] = tf.function(lambda features, name=name: self._encode(name, self._mapped(name, features)),
                                            input_signature=[tf.TensorSpec([None, *self.raw_vectors.get(name, shape)], tf.float32,
                                                                           name=name)])  # fmt: skip

    def _parse(self, examples):
        return self.tft_layer(finite_features(tf.io.parse_example(examples, self.spec)))

    def _mapped(self, name: str, features):
        """``features`` as the model takes them: raw vectors checked and mapped through the
        Transform graph (``raw_vectors``); other inputs as they are."""
        if name not in self.raw_vectors:
            return features
        raw = checked_input(features, name, self.raw_vectors[name], self.value_ranges[name])
        return self.tft_layer({name: raw})[name]

    def _encode(self, name: str, features):
        features = checked_input(features, name, self.inputs[name], self.value_ranges[name])
        encoder = self.encoders[name]
        codes = mirror_averaged(encoder, features) if name in self.mirrored else encoder(features, training=False)
        return code_outputs(tf.cast(codes, tf.float32), self.bits)

    def signatures(self) -> dict:
        """``serving_default`` / ``encode_features`` (/ ``encode_pixels``) for the first input;
        with two inputs also ``serving_<name>`` / ``encode_<name>`` (/ ``encode_pixels_<name>``)
        for each."""
        first = next(iter(self.inputs))
        named = [None] + (list(self.inputs) if len(self.inputs) > 1 else [])
        out = {}
        for modality in named:
            name = modality or first
            out[examples_signature(modality)], out[features_signature(modality)] = self.serve[name], self.encode[name]
            if name in self.pixels:
                out[pixels_signature(modality)] = self.pixels[name]
        return out


def export_serving_model(model, tf_transform_output, inputs: dict, bits: int, path: str,
                         warmup_examples: list[bytes] | None = None, model_name: str = "tfhash",
                         value_ranges: dict | None = None, image_inputs=(), mirrored_inputs=(),
                         raw_vectors: dict | None = None) -> None:  # fmt: skip
    """Save ``model`` with the Transform graph as a SavedModel at ``path``; ``image_inputs`` get an
    ``encode_pixels`` signature; ``mirrored_inputs`` are encoded with their mirror
    (:func:`mirror_averaged`).

    The SavedModel's signatures:

    * ``serving_default``: ``examples`` (serialized raw tf.Example, string ``[None]``) -> parsed
      with the raw feature spec, transformed by the Transform graph (labels and id are not
      required), then encoded;
    * ``encode_features``: the input as a tensor -> encoded: a vector input raw, mapped by the
      Transform graph as ``serving_default`` maps it (``raw_vectors``: ``{name: raw shape}``), an
      image decoded to float pixels;
    * ``encode_pixels`` when the input is an image: raw ``uint8`` pixels ``[None, *image shape]``
      -> encoded (the model resizes and preprocesses them itself);
    * cross-modal models (two inputs) add ``serving_<modality>`` and ``encode_<modality>`` (and
      ``encode_pixels_<modality>`` for an image modality) for each modality; the default
      signatures encode the first one.

    Every signature returns ``codes`` (continuous float32), ``binary_codes`` (int8 +-1,
    sign(0) = +1) and ``packed_codes`` (uint8, big bit order; docs/design.md s.2)."""
    module = ServingModule(model, tf_transform_output.transform_features_layer(),
                           tf_transform_output.raw_feature_spec(), inputs, bits, value_ranges, image_inputs, mirrored_inputs,
                           raw_vectors)  # fmt: skip
    save_serving_module(module, path, warmup_examples, model_name)


def export_feature_model(model, path: str, input_name: str, input_shape, bits: int,
                         warmup_examples: list[bytes] | None = None, model_name: str = "tfhash",
                         value_range: tuple | None = None) -> None:  # fmt: skip
    """Export a tfhash Keras model whose input needs no Transform (outside the pipeline): the
    serialized tf.Examples of ``serving_default`` carry the float features as ``input_name``
    (fixed length ``input_shape``), ``encode_features`` takes them as a tensor; both refuse values
    outside ``value_range`` (default +-:data:`DEFAULT_VALUE_BOUND`)."""
    spec = {input_name: modality_spec("vector", input_shape)}
    module = ServingModule(model, lambda parsed: parsed, spec, {input_name: list(input_shape)}, bits,
                           {input_name: value_range} if value_range is not None else None)  # fmt: skip
    save_serving_module(module, path, warmup_examples, model_name)


def export_image_model(model, path: str, image_shape, bits: int, input_name: str = "image",
                       warmup_examples: list[bytes] | None = None, model_name: str = "tfhash", mirrored: bool = False) -> None:  # fmt: skip
    """Export a tfhash Keras image model outside the pipeline (its backbone resizes and
    preprocesses, e.g. :func:`tfhash.models.image_backbone`): ``serving_default`` takes
    tf.Examples whose ``input_name`` holds the encoded image (PNG or JPEG), ``encode_pixels`` raw
    ``uint8`` pixels, ``encode_features`` float pixels; every image must be ``image_shape``.
    ``mirrored``: encode each image with its mirror (:func:`mirror_averaged`)."""
    shape = [int(s) for s in image_shape]
    spec = {input_name: modality_spec("image", shape)}
    module = ServingModule(model, lambda parsed: {input_name: decode_images(parsed[input_name], shape)}, spec,
                           {input_name: shape}, bits, {input_name: IMAGE_RANGE}, image_inputs=[input_name],
                           mirrored_inputs=[input_name] if mirrored else [])  # fmt: skip
    save_serving_module(module, path, warmup_examples, model_name)


def save_serving_module(module: ServingModule, path: str, warmup_examples: list[bytes] | None = None,
                        model_name: str = "tfhash") -> None:  # fmt: skip
    """Write ``module``'s signatures as a SavedModel, plus the warmup records.

    The saved object graph holds only what the signatures use: the variables they read and the
    Transform layer (its tables and assets), not the Keras model. Keras 3 variables saved through
    the model object are restored by ``tf.saved_model.load`` but not by the graph-mode loader of
    ``tensorflow_model_server`` and ``saved_model_cli`` ("Could not find variable ..."), as
    ``keras.export.ExportArchive`` also avoids.
    """
    signatures = {name: function.get_concrete_function() for name, function in module.signatures().items()}
    root = tf.Module()
    used = {}
    for concrete in signatures.values():
        for variable in concrete.variables:
            used.setdefault(id(variable), variable)
    root.variables_used = list(used.values())
    if isinstance(module.tft_layer, tf.__internal__.tracking.Trackable):
        root.transform = module.tft_layer
    tf.saved_model.save(root, path, signatures=signatures)
    if warmup_examples:
        write_warmup_requests(path, warmup_examples, model_name)


def write_warmup_requests(path: str, serialized_examples: list[bytes], model_name: str) -> str:
    """TF Serving warmup file: PredictionLogs replaying a few Predict requests on serving_default,
    written to ``assets.extra/tf_serving_warmup_requests`` in the SavedModel at ``path``."""
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    target = storage.join(path, WARMUP_FILE)
    storage.makedirs(storage.parent(target))
    with tf.io.TFRecordWriter(target) as writer:
        request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name=model_name, signature_name=EXAMPLES_SIGNATURE))
        request.inputs[EXAMPLES_INPUT].CopyFrom(tf.make_tensor_proto(serialized_examples, dtype=tf.string))
        log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
        writer.write(log.SerializeToString())
    return target
