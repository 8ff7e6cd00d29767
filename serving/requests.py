"""What a search request may hold, checked where it enters the service (gRPC, REST, or a
:class:`Query` built in Python) and before anything is allocated from a size the client chose.

Range, width and the model's own shape are checked by the exported signature itself
(:mod:`tfhash.export`), so TF Serving refuses what the search service refuses. Every
refusal is a :class:`~tfhash.serving.errors.ServingError` INVALID_ARGUMENT that names the value.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import warnings
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError
from tfhash.serving.errors import invalid, quoted_value

__all__ = ["Limits", "DEFAULT_LIMITS", "check_features", "require_complete_parse", "decode_whole", "check_examples", "Query", "join_queries", "query_from_proto", "json_object", "json_numbers", "json_int", "json_bool", "json_version", "query_from_json"]


#: Batch axis plus at most seven feature axes.
MAX_FEATURE_DIMS = 8
QUERY_FIELDS = ("examples", "features", "codes", "packed_codes")
JSON_FIELDS = (*QUERY_FIELDS, "k", "radius", "model_version", "refine")


@dataclass(frozen=True)
class Limits:
    """Request limits of the search service: queries per request and neighbours per query. An
    answer holds at most ``max_batch * max_k`` neighbours whatever the radius (a radius filters the
    k nearest, it never widens the search)."""

    max_batch: int = 256
    max_k: int = 1000


DEFAULT_LIMITS = Limits()


def check_features(features) -> np.ndarray:
    """Raw features as float32 with a batch axis; non-numeric, NaN or infinite values are refused
    (they would encode to a meaningless code, not an error, on some CPUs).

    The batch axis comes first, and at most :data:`MAX_FEATURE_DIMS` axes are taken.
    """
    array = np.asarray(features)
    if not 2 <= array.ndim <= MAX_FEATURE_DIMS:
        raise invalid(f"features need a batch axis first and at most {MAX_FEATURE_DIMS} axes, got shape {list(array.shape)}")
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise invalid(f"features must be numeric, got {array.dtype}")
    with np.errstate(over="ignore"):
        array = array.astype(np.float32)
    if not np.all(np.isfinite(array)):
        raise invalid("features contain NaN or infinite values (or values beyond float32)")
    return array


# protobuf's C++ parser stops at a tag 0 or an end-group tag with only this warning and returns
# what it read so far; require_complete_parse detects that case itself and refuses the bytes.
warnings.filterwarnings("ignore", message="Unexpected end-group tag", category=RuntimeWarning)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


#: An unknown varint field (the largest field number, value 0), read only after a complete message.
_END_PROBE = _varint((2**29 - 1) << 3) + b"\x00"


def require_complete_parse(message_type, data: bytes) -> None:
    """Refuse bytes that ``message_type.FromString`` read only in part: the parser stopped at a
    tag 0 or an end-group tag and ignored the rest (it raises only for truncated bytes)."""
    if message_type().ParseFromString(data + _END_PROBE) != len(data) + len(_END_PROBE):
        raise DecodeError("the parser stopped before the end of the bytes (a tag 0 or an end-group tag)")


def decode_whole(decode, data: bytes):
    """``decode(data)`` (a message type's ``FromString``, a gRPC request deserializer), refused
    when the parser read the bytes only in part (:func:`require_complete_parse`): the one rule both servers'
    request bytes pass."""
    message = decode(data)
    require_complete_parse(type(message), data)
    return message


def check_examples(serialized) -> list[bytes]:
    """Serialized tf.Examples that parse strictly and whose float features are all finite.

    A truncated or malformed record is refused here, not left to the model's lenient parser.
    """
    # here, not at the top: importing it loads TensorFlow, which a service's supervising parent
    # (tfhash.serving.processes) never needs
    from tensorflow.core.example import example_pb2

    records = list(serialized)
    for i, record in enumerate(records):
        if not isinstance(record, bytes):
            raise invalid(f"examples[{i}] must be bytes (a serialized tf.Example), got {type(record).__name__}")
        try:
            example = example_pb2.Example.FromString(record)
            require_complete_parse(example_pb2.Example, record)
        except DecodeError as err:
            raise invalid(f"examples[{i}] is not a serialized tf.Example (truncated or malformed: {err})") from err
        for name, feature in example.features.feature.items():
            if feature.WhichOneof("kind") == "float_list" and not np.all(np.isfinite(np.asarray(feature.float_list.value, np.float32))):
                raise invalid(f"examples[{i}]: feature {quoted_value(name)} holds NaN or infinite values")
    return records


@dataclass(frozen=True)
class Query:
    """One search request as every front parses it, once, where it enters: exactly one of
    ``examples`` (serialized tf.Examples), ``features`` (numbers, batch first) or ``codes`` (packed
    uint8 (n, K/8) or +-1 (n, K)), checked on creation (:func:`check_examples`,
    :func:`check_features`), and the search's ``k``, ``radius``, pinned ``model_version`` ("":
    any) and ``refine`` (order by the stored embeddings where the index has them). The layers below trust the inputs; what depends on the service's limits and on the
    served pair (k, radius, the batch size, the code width, the version) is checked by
    :meth:`tfhash.serving.searcher.VersionedSearcher.search`."""

    examples: list | None = None
    features: np.ndarray | None = None
    codes: np.ndarray | None = None
    k: int = 10
    radius: int | None = None
    model_version: str = ""
    refine: bool = True

    def __post_init__(self):
        given = [x for x in (self.examples, self.features, self.codes) if x is not None]
        if len(given) != 1:
            raise invalid("a request needs exactly one of examples, features or codes")
        if self.examples is not None:
            object.__setattr__(self, "examples", check_examples(self.examples))
        if self.features is not None:
            object.__setattr__(self, "features", check_features(self.features))

    @property
    def form(self) -> str:
        """Which input the query holds: ``"examples"``, ``"features"`` or ``"codes"``."""
        return "examples" if self.examples is not None else "features" if self.features is not None else "codes"

    @property
    def size(self) -> int:
        return len(getattr(self, self.form))

    @property
    def join_key(self) -> tuple:
        """Queries with equal keys can be answered by one call (:func:`join_queries`): the same
        form, k, radius, pinned version and refine, and rows of the same type and shape."""
        rows = getattr(self, self.form)
        layout = None if self.form == "examples" else (rows.dtype.str, rows.shape[1:])
        return self.form, self.k, self.radius, self.model_version, self.refine, layout


def join_queries(queries: list[Query]) -> Query:
    """Queries of one :attr:`Query.join_key` as one query, their rows in order; their inputs are
    not checked again (each was checked when it was made)."""
    first = queries[0]
    if any(q.join_key != first.join_key for q in queries):
        raise ValueError("only queries of one join key can be joined")
    parts = [getattr(q, first.form) for q in queries]
    joined = object.__new__(Query)  # the fields set directly: no second check of the rows
    for name in ("examples", "features", "codes", "k", "radius", "model_version", "refine"):
        object.__setattr__(joined, name, getattr(first, name))
    object.__setattr__(joined, first.form, [row for part in parts for row in part] if first.form == "examples" else np.concatenate(parts))
    return joined


def features_from_flat(shape, values) -> np.ndarray:
    """Features sent as a shape and row-major values (the gRPC ``Features`` message).

    The shape is multiplied in Python integers (no overflow) and must hold exactly the values sent.
    """
    shape = [int(d) for d in shape]
    if not 2 <= len(shape) <= MAX_FEATURE_DIMS or any(d <= 0 for d in shape):
        quoted = shape if len(shape) <= MAX_FEATURE_DIMS else f"[{', '.join(map(str, shape[:MAX_FEATURE_DIMS]))}, ...] ({len(shape)} axes)"
        raise invalid(f"features: shape {quoted} must be batch first with 2..{MAX_FEATURE_DIMS} axes, each >= 1")
    if math.prod(shape) != len(values):
        raise invalid(f"features: shape {shape} needs {math.prod(shape)} values, the request holds {len(values)}")
    return np.asarray(values, dtype=np.float32).reshape(shape)


def codes_from_proto(codes) -> np.ndarray:
    """The ``Codes`` message as packed uint8 rows or +-1 rows (the searcher checks values and width)."""
    bits = int(codes.bits)
    if bits <= 0 or bits % 8:
        raise invalid(f"codes.bits must be a positive multiple of 8, got {bits}")
    if codes.WhichOneof("form") == "signs":
        values = np.asarray(codes.signs.values, dtype=np.int64)
        if values.size % bits:
            raise invalid(f"codes.signs holds {values.size} values, not a multiple of bits = {bits}")
        return values.reshape(-1, bits)
    packed = np.frombuffer(codes.packed, dtype=np.uint8)
    if packed.size % (bits // 8):
        raise invalid(f"codes.packed holds {packed.size} bytes, not a multiple of bits / 8 = {bits // 8}")
    return packed.reshape(-1, bits // 8)


def query_from_proto(request) -> Query:
    """A ``SearchRequest`` as a :class:`Query`."""
    which = request.WhichOneof("query")
    if which is None:
        raise invalid("the request has no query: set examples, features or codes")
    search = {"k": request.k, "radius": request.radius if request.HasField("radius") else None, "model_version": request.model_version,
              "refine": request.refine if request.HasField("refine") else True}  # fmt: skip
    if which == "examples":
        return Query(examples=list(request.examples.serialized), **search)
    if which == "features":
        return Query(features=features_from_flat(request.features.shape, request.features.values), **search)
    return Query(codes=codes_from_proto(request.codes), **search)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def json_object(raw: bytes, fields=None) -> dict:
    """A request body: a JSON object in UTF-8 (no ``NaN`` / ``Infinity``) with known fields
    (``fields``, default those of ``POST /v1/search``)."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError as err:
        raise invalid("the body is nested too deeply") from err
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, integers of too many digits
        raise invalid(f"the body is not valid JSON in UTF-8 ({err})") from err
    if not isinstance(body, dict):
        raise invalid(f"the body must be a JSON object, got {type(body).__name__}")
    fields = JSON_FIELDS if fields is None else fields
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise invalid(f"unknown fields {unknown}; the body takes {list(fields)}")
    return body


def json_numbers(value, field: str, dtype, max_dims: int = MAX_FEATURE_DIMS) -> np.ndarray:
    """A rectangular nested list of JSON numbers, batch first (at least two levels), as an array;
    checked level by level (no recursion) before NumPy sees it.

    Strings, booleans and ``null`` are refused (:func:`json_object` already refuses ``NaN``).
    """
    level, shape = [value], []
    while level and all(type(x) is list for x in level):
        lengths = {len(x) for x in level}
        if len(lengths) != 1:
            raise invalid(f"{field} is not rectangular: lists of lengths {sorted(lengths)[:4]} at depth {len(shape) + 1}")
        shape.append(lengths.pop())
        if len(shape) > max_dims:
            raise invalid(f"{field} has more than {max_dims} levels of lists")
        level = [item for x in level for item in x]
    if len(shape) < 2:
        raise invalid(f"{field} must be a list of queries, each a list (batch first), got {len(shape)} level(s) of lists")
    kinds = {type(x) for x in level}
    if not kinds <= {int, float}:
        names = sorted({"string" if k is str else "boolean" if k is bool else "null" if k is type(None) else
                        "list" if k is list else "object" if k is dict else k.__name__ for k in kinds - {int, float}})  # fmt: skip
        raise invalid(f"{field} must hold only numbers in rectangular lists, found {', '.join(names)}")
    try:
        return np.asarray(value, dtype=dtype)
    except (OverflowError, ValueError) as err:
        raise invalid(f"{field}: a number is out of range ({err})") from err


def json_int(body: dict, name: str, default=None):
    """An optional integer field (booleans and floats are refused)."""
    value = body.get(name, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise invalid(f"{name} must be an integer, got {value!r}"[:200])
    return value


def json_bool(body: dict, name: str, default: bool) -> bool:
    """An optional boolean field (``true`` / ``false`` only: numbers and strings are refused)."""
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false, got {value!r}"[:200])
    return value


def json_version(body: dict) -> str:
    value = body.get("model_version", "")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise invalid(f"model_version must be a string (or an integer), got {type(value).__name__}")
    return str(value)


def _base64_rows(values, field: str) -> list[bytes]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise invalid(f"{field} must be a list of base64 strings")
    try:
        return [base64.b64decode(v, validate=True) for v in values]
    except (binascii.Error, ValueError) as err:
        raise invalid(f"{field}: invalid base64 ({err})") from err


def query_from_json(body: dict) -> Query:
    """A REST body (:func:`json_object`) as a :class:`Query` (``k`` 10 when it is left out)."""
    given = [f for f in QUERY_FIELDS if f in body]
    if len(given) != 1:
        raise invalid(f"the body needs exactly one of {list(QUERY_FIELDS)}, got {given}")
    (field,) = given
    search = {"k": json_int(body, "k", 10), "radius": json_int(body, "radius"), "model_version": json_version(body),
              "refine": json_bool(body, "refine", True)}  # fmt: skip
    if field == "examples":
        return Query(examples=_base64_rows(body[field], field), **search)
    if field == "features":
        return Query(features=json_numbers(body[field], field, np.float32), **search)
    if field == "codes":  # the searcher refuses values other than +-1
        return Query(codes=json_numbers(body[field], field, np.float64, max_dims=2), **search)
    rows = _base64_rows(body[field], field)
    if not rows:
        raise invalid("packed_codes holds no queries")
    widths = {len(r) for r in rows}
    if len(widths) > 1 or 0 in widths:
        raise invalid(f"packed_codes must all have the same, non-zero length in bytes; got lengths {sorted(widths)[:4]}")
    return Query(codes=np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), -1), **search)
