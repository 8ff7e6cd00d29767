"""Bounded fuzz of the serving layer over loopback: the search service's gRPC front (in-process and
remote encoding), its REST front (JSON and broken HTTP on raw sockets) and the development model
server (``PredictionService``, ``ModelService``), plus the health service.

Every request is generated together with what it must get, so the run checks answers, not only
survival:

* a request that is bad by construction (NaN features, a truncated tf.Example, k = 0, a shape whose
  product overflows, JSON nested 100,000 deep, a TLS handshake on the REST port, ...) must be
  refused with one of the codes listed for its category;
* a valid request must be answered OK;
* random bytes, which may or may not decode to a valid request, must get anything but a fault.

Outcomes counted as failures: a fault (gRPC INTERNAL or UNKNOWN, HTTP 500), a hang (no answer and
no closed connection within the deadline), a bad input answered OK, a valid request refused, and
a refusal with a code the category does not allow. :func:`run` returns the counts per target and
category; :mod:`tests.serving_robustness` runs it at scale and writes the results, and
``tests/test_serving_robustness.py`` runs a smaller draw in the suite.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import socket
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import numpy as np
from tensorflow.core.example import example_pb2, feature_pb2
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    predict_pb2,
)
from tfhash.serving import search_pb2
from tfhash.serving.requests import Limits

from tfhash.artifacts import EXAMPLES_INPUT, EXAMPLES_SIGNATURE, FEATURES_SIGNATURE

OK = frozenset({"OK"})
INVALID = frozenset({"INVALID_ARGUMENT"})
NOT_FOUND = frozenset({"NOT_FOUND"})
TOO_LARGE = frozenset({"RESOURCE_EXHAUSTED"})
INVALID_OR_TOO_LARGE = INVALID | TOO_LARGE
ANY = None  # anything but a fault or a hang
HTTP_OK = frozenset({"http-200"})
HTTP_BAD = frozenset({"http-400"})
#: Connection-level abuse: an HTTP error answer or a closed connection, in time.
HTTP_REFUSED = frozenset({"http-400", "http-408", "http-413", "http-431", "closed"})
FAULTS = frozenset({"INTERNAL", "UNKNOWN", "http-500"})


@dataclass(frozen=True)
class Target:
    """The servers under test and what the fuzzer must know about them."""

    search: dict  # label -> gRPC address of a search service ("in_process", "remote")
    rest_port: int | None
    model_server: str | None
    model_name: str
    feature: str  # the tf.Example feature and the encode_features input
    dim: int
    bits: int
    count: int  # items in the served index
    version: int  # the served model version
    vectors: np.ndarray  # valid feature rows
    limits: Limits = Limits()
    search_max_bytes: int = 1 << 20
    model_max_bytes: int = 64 << 20
    rest_timeout: float = 1.0  # the REST front's header and body timeouts
    deadline: float = 10.0


@dataclass
class Tally:
    """Counts per (target, category) and the first few failures of each kind."""

    sent: Counter = field(default_factory=Counter)
    outcomes: dict = field(default_factory=lambda: defaultdict(Counter))
    failures: Counter = field(default_factory=Counter)
    examples: list = field(default_factory=list)
    seconds: float = 0.0

    def record(self, target: str, category: str, expected, got: str, detail: str = "") -> None:
        key = f"{target}/{category}"
        self.sent[key] += 1
        self.outcomes[key][got] += 1
        kind = failure_kind(expected, got)
        if kind:
            self.failures[kind] += 1
            if len(self.examples) < 50:
                self.examples.append({"request": key, "expected": sorted(expected) if expected else "any", "got": got,
                                      "failure": kind, "detail": detail[:300]})  # fmt: skip

    def summary(self) -> dict:
        return {
            "requests": sum(self.sent.values()),
            "seconds": round(self.seconds, 1),
            "failures": dict(self.failures),
            "per_category": {key: {"sent": self.sent[key], "outcomes": dict(self.outcomes[key])} for key in sorted(self.sent)},
            "failure_examples": self.examples,
        }


def failure_kind(expected, got: str) -> str | None:
    """Why an outcome fails its expectation, or None."""
    if got in FAULTS:
        return "fault"
    if got == "hang":
        return "hang"
    if expected is ANY:
        return None
    if got in expected:
        return None
    if got in ("OK", "http-200"):
        return "bad input answered OK"
    if expected in (OK, HTTP_OK):
        return "valid request refused"
    return "unexpected code"


# ----------------------------------------------------------------------------------------- inputs


def example(values, name: str, kind: str = "float", item_id: int | None = None) -> bytes:
    features = {}
    if kind == "float":
        features[name] = feature_pb2.Feature(float_list=feature_pb2.FloatList(value=[float(v) for v in values]))
    elif kind == "int":
        features[name] = feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[int(v) for v in values]))
    else:
        features[name] = feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=[b"x" for _ in values]))
    if item_id is not None:
        features["id"] = feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[item_id]))
    return example_pb2.Example(features=feature_pb2.Features(feature=features)).SerializeToString()


def rows(rng: random.Random, t: Target, n: int | None = None) -> np.ndarray:
    n = n or rng.randint(1, 4)
    picked = t.vectors[[rng.randrange(len(t.vectors)) for _ in range(n)]]
    return (picked + np.float32(rng.uniform(-0.1, 0.1))).astype(np.float32)


def poisoned(rng: random.Random, values: np.ndarray, kind: str) -> np.ndarray:
    """``values`` with one to all cells NaN / +-inf (``nonfinite``) or far out of range."""
    out = values.astype(np.float64).copy()
    flat = out.reshape(-1)
    cells = rng.sample(range(flat.size), rng.randint(1, flat.size))
    for cell in cells:
        flat[cell] = rng.choice([np.nan, np.inf, -np.inf]) if kind == "nonfinite" else rng.choice([1, -1]) * 10.0 ** rng.uniform(7, 30)
    return out


def k_valid(rng: random.Random, t: Target) -> int:
    return rng.choice([1, 3, 10, min(t.limits.max_k, t.count)])


# ------------------------------------------------------------------------------ gRPC search service


def _search(rng: random.Random, t: Target, **fields) -> search_pb2.SearchRequest:
    request = search_pb2.SearchRequest(k=fields.pop("k", k_valid(rng, t)))
    if "radius" in fields:
        request.radius = fields.pop("radius")
    elif rng.random() < 0.3:
        request.radius = rng.choice([0, 1, 5, t.bits, 2**31 - 1])
    if "model_version" in fields:
        request.model_version = fields.pop("model_version")
    elif rng.random() < 0.2:
        request.model_version = str(t.version)
    return request


def _with_features(request, values: np.ndarray, shape=None):
    request.features.shape.extend(list(values.shape) if shape is None else shape)
    request.features.values.extend(np.asarray(values, np.float64).ravel().tolist())
    return request


def _with_examples(request, records):
    request.examples.serialized.extend(records)
    return request


def _bad_shape(rng: random.Random, t: Target):
    """(shape, number of values) that no model input of width ``dim`` takes."""
    d = t.dim
    return rng.choice([([d], d), ([0, d], 0), ([-1, d], d), ([1, d + 1], d + 1), ([1, d - 1], d - 1),
                       ([2**32, 2**32], 4), ([2**31, 2**33], 0), ([1] * 9, 1), ([1, d, 1], d), ([2, d], d)])  # fmt: skip


def search_cases(rng: random.Random, t: Target) -> dict:
    """category -> request generator (SearchRequest or raw bytes, expected outcomes)."""
    d, bits, limits = t.dim, t.bits, t.limits

    def valid_request():
        kind = rng.randrange(4)
        values = rows(rng, t)
        request = _search(rng, t)
        if kind == 0:
            return _with_features(request, values)
        if kind == 1:
            return _with_examples(request, [example(v, t.feature, item_id=rng.randrange(99)) for v in values])
        packed = np.packbits([rng.getrandbits(1) for _ in range(len(values) * bits)]).reshape(len(values), -1)
        request.codes.bits = bits
        if kind == 2:
            request.codes.packed = packed.tobytes()
        else:
            request.codes.signs.values.extend((np.unpackbits(packed, axis=1).astype(int) * 2 - 1).ravel().tolist())
        return request

    def truncated_bytes():
        raw = valid_request().SerializeToString()
        cut = raw[: rng.randrange(1, len(raw))]
        try:
            search_pb2.SearchRequest.FromString(cut)
            return cut, ANY  # cut at a field boundary: a shorter, possibly valid request
        except Exception:  # noqa: BLE001 - the oracle: protobuf's own parser refuses it
            return cut, INVALID

    def bad_examples():
        values = rows(rng, t, 1)[0]
        record = example(values, t.feature)
        return rng.choice([
            example(poisoned(rng, values, "nonfinite"), t.feature),
            example(poisoned(rng, values, "range"), t.feature),
            example(values[: rng.randrange(0, d)], t.feature),
            example(np.concatenate([values, values[:1]]), t.feature),
            example(values, t.feature, kind=rng.choice(["int", "bytes"])),
            example(values, t.feature + "_other"),
            record[: rng.randrange(1, len(record))],
            record + rng.choice([b"\x00", b"\x0c", b"\x04", b"\x00" + rng.randbytes(8), b"\x0f\x01"]),
            b"",
        ])  # fmt: skip

    def signs_bad():
        request = _search(rng, t)
        request.codes.bits = bits
        values = [rng.choice([-1, 1]) for _ in range(bits)]
        if rng.random() < 0.5:
            values[rng.randrange(bits)] = rng.choice([0, 2, 5, -7])
        else:
            values = values[: rng.randrange(1, bits)]
        request.codes.signs.values.extend(values)
        return request

    def codes_bad_bits():
        request = _search(rng, t)
        request.codes.bits = rng.choice([0, -8, 7, 12, 2**31 - 1, -(2**31), 8, 2 * bits])
        width = max(request.codes.bits // 8, 1)
        request.codes.packed = rng.randbytes(width if width < 64 else 3)
        return request

    def packed_bad_length():
        request = _search(rng, t)
        request.codes.bits = bits
        request.codes.packed = rng.randbytes(rng.choice([0, bits // 8 - 1, bits // 8 + 1, 3 * bits // 8 - 1]))
        return request

    def features_shape():
        shape, n = _bad_shape(rng, t)
        return _with_features(_search(rng, t), np.zeros(n, np.float32), shape)

    def empty_examples():
        request = _search(rng, t)
        request.examples.SetInParent()
        return request

    def long_text():
        """Client-chosen text that an error message might quote: a shape of 100,000 axes, a 50 kB
        feature name, a 100 kB model version."""
        choice = rng.randrange(3)
        if choice == 0:
            return _with_features(_search(rng, t), np.zeros(1, np.float32), [1] * 100_000), INVALID
        if choice == 1:
            return _with_examples(_search(rng, t), [example([float("nan")] * d, "f" * 50_000)]), INVALID
        return _with_features(_search(rng, t, model_version="9" * 100_000), rows(rng, t)), NOT_FOUND

    def count_mismatch():
        values = rows(rng, t)
        request = _with_features(_search(rng, t), values)
        if rng.random() < 0.5:
            request.features.values.append(0.5)
        else:
            del request.features.values[-1]
        return request

    return {
        "valid": lambda: (valid_request(), OK),
        "no query": lambda: (_search(rng, t), INVALID),
        "features NaN/inf": lambda: (_with_features(_search(rng, t), poisoned(rng, rows(rng, t), "nonfinite")), INVALID),
        "features out of range": lambda: (_with_features(_search(rng, t), poisoned(rng, rows(rng, t), "range")), INVALID),
        "features bad shape": lambda: (features_shape(), INVALID),
        "features count mismatch": lambda: (count_mismatch(), INVALID),
        "too many queries": lambda: (_with_features(_search(rng, t), rows(rng, t, limits.max_batch + 1)), INVALID),
        "examples empty list": lambda: (empty_examples(), INVALID),
        "examples bad": lambda: (_with_examples(_search(rng, t), [bad_examples()]), INVALID),
        "codes bad bits": lambda: (codes_bad_bits(), INVALID),
        "codes packed length": lambda: (packed_bad_length(), INVALID),
        "codes signs": lambda: (signs_bad(), INVALID),
        "k out of range": lambda: (_with_features(_search(rng, t, k=rng.choice(
            [0, -1, -(2**31), limits.max_k + 1, 2**31 - 1] + ([t.count + 1] if t.count < limits.max_k else []))), rows(rng, t)), INVALID),
        "radius negative": lambda: (_with_features(_search(rng, t, radius=rng.choice([-1, -5, -(2**31)])), rows(rng, t)), INVALID),
        "model version unknown": lambda: (_with_features(_search(rng, t, model_version=rng.choice(
            [str(t.version + 1), "0", "x" * 1000, "\u00e9t\u00e9", f"{t.version} ", "-1"])), rows(rng, t)), NOT_FOUND),
        "oversized message": lambda: (_with_examples(_search(rng, t), [b"x" * (t.search_max_bytes + 16)]), TOO_LARGE),
        "undecodable bytes": lambda: (valid_request().SerializeToString() + rng.choice([b"\x00", b"\x0c", b"\x0e\x01", b"\x07"]), INVALID),
        "truncated bytes": truncated_bytes,
        "random bytes": lambda: (rng.randbytes(rng.randrange(0, 64)), ANY),
        "long client text": long_text,
    }  # fmt: skip


# -------------------------------------------------------------------------------------- REST front


def _json_request(body: dict | bytes, content_type: str = "application/json", method: str = "POST", path: str = "/v1/search"):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return method, path, {"Content-Type": content_type} if content_type else {}, raw


def rest_cases(rng: random.Random, t: Target) -> dict:
    d, bits, limits = t.dim, t.bits, t.limits

    def query(n=None) -> dict:
        values = rows(rng, t, n)
        kind = rng.randrange(4)
        if kind == 0:
            body = {"features": values.tolist()}
        elif kind == 1:
            body = {"examples": [base64.b64encode(example(v, t.feature)).decode() for v in values]}
        else:
            packed = np.packbits([rng.getrandbits(1) for _ in range(len(values) * bits)]).reshape(len(values), -1)
            body = ({"codes": (np.unpackbits(packed, axis=1).astype(int) * 2 - 1).tolist()} if kind == 2
                    else {"packed_codes": [base64.b64encode(p.tobytes()).decode() for p in packed]})  # fmt: skip
        body["k"] = k_valid(rng, t)
        if rng.random() < 0.3:
            body["radius"] = rng.choice([0, 2, bits, 2**31 - 1, 10**40])
        if rng.random() < 0.2:
            body["model_version"] = rng.choice([str(t.version), t.version])
        return body

    def with_features(values) -> dict:
        return {"features": values, "k": 3}

    def nested(depth: int, opener: bytes = b"[", closer: bytes = b"]") -> bytes:
        return b'{"features": ' + opener * depth + b"1" + closer * depth + b', "k": 3}'

    def bad_json() -> bytes:
        good = json.dumps(query()).encode()
        return rng.choice([
            good[: rng.randrange(1, len(good))], good + b"}", good.replace(b'"', b"'"), b"", b"\x00" * 8,
            nested(rng.choice([40, 1000, 50_000])), nested(rng.choice([1000, 20_000]), b'{"a": ', b"}"),
            b'{"k": ' + b"9" * rng.choice([4301, 10_000]) + b"}",
            b'{"features": [[' + b"1" * 5000 + b"]], \"k\": 3}",
            b'{"k": "\xff\xfe"}', b'{"features": [[NaN]], "k": 3}', b'{"features": [[Infinity, -Infinity]], "k": 3}',
            b'[1, 2]', b'"text"', b"12", b"null", b"true",
        ])  # fmt: skip

    def bad_types() -> dict:
        body = query()
        choice = rng.randrange(9)
        if choice == 0:
            body["k"] = rng.choice([3.0, "3", True, None, [3], {"k": 3}, 2.5])
        elif choice == 1:
            body["radius"] = rng.choice([1.5, "2", False, [1], -1, -(10**30)])
        elif choice == 2:
            body["model_version"] = rng.choice([{"v": 1}, [1], True, 1.0])
        elif choice == 3:
            body = with_features([[rng.choice(["1", True, None, {"x": 1}, [1]])] * d])
        elif choice == 4:
            body = {"codes": [[str(rng.choice([-1, 1])) for _ in range(bits)]], "k": 3}
        elif choice == 5:
            body = with_features(rng.choice([[], [[]], [1.0] * d, [[1.0] * d, [1.0] * (d - 1)], [[[[[[[[[[1.0]]]]]]]]]], "x", 1, None]))
        elif choice == 6:
            body[rng.choice(["extra", "radus", "K", "query"])] = 1
        elif choice == 7:
            body = {"k": 3} if rng.random() < 0.5 else {**query(), "features": [[1.0] * d], "codes": [[1] * bits]}
        else:
            body = {"codes": [[1.0] * bits, [1.0] * (bits - 1)], "k": 3}
        return body

    def bad_base64() -> dict:
        choice = rng.randrange(7)
        if choice == 0:
            return {"packed_codes": [], "k": 3}
        if choice == 1:
            return {"packed_codes": ["", ""], "k": 3}
        if choice == 2:
            return {"packed_codes": ["not base64!", "AAAA"], "k": 3}
        if choice == 3:
            return {"packed_codes": [base64.b64encode(rng.randbytes(bits // 8 + 1)).decode()], "k": 3}
        if choice == 4:
            return {"packed_codes": [base64.b64encode(b"\x00" * (bits // 8)).decode(), base64.b64encode(b"\x00").decode()], "k": 3}
        if choice == 5:
            return {"examples": ["%%%", 1], "k": 3}
        return {"examples": [base64.b64encode(b"\x0a\x05junk").decode()], "k": 3}

    def k_bad() -> dict:
        return {**query(), "k": rng.choice([0, -1, limits.max_k + 1, 10**40] + ([t.count + 1] if t.count < limits.max_k else []))}

    return {
        "valid": lambda: (_json_request(query()), HTTP_OK),
        "JSON syntax, encoding, depth, size": lambda: (_json_request(bad_json()), HTTP_BAD),
        "JSON types and shapes": lambda: (_json_request(bad_types()), HTTP_BAD),
        "base64 fields": lambda: (_json_request(bad_base64()), HTTP_BAD),
        "features NaN/inf/out of range": lambda: (_json_request(with_features(poisoned(rng, rows(rng, t), "range").tolist())), HTTP_BAD),
        "examples NaN/inf": lambda: (_json_request({"examples": [base64.b64encode(example(poisoned(rng, rows(rng, t, 1)[0], "nonfinite"), t.feature)).decode()], "k": 3}), HTTP_BAD),
        "k out of range": lambda: (_json_request(k_bad()), HTTP_BAD),
        "too many queries": lambda: (_json_request({"features": rows(rng, t, limits.max_batch + 1).tolist(), "k": 3}), HTTP_BAD),
        "model version unknown": lambda: (_json_request({**query(), "model_version": rng.choice([str(t.version + 1), "x" * 500, 0])}), frozenset({"http-404"})),
        "content type": lambda: (_json_request(query(), rng.choice(["", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "application/jsonx",
                                                                    "application/json; charset=utf-16", 'application/json; charset="latin-1"'])), frozenset({"http-415"})),
        "method": lambda: (_json_request(query(), method=rng.choice(["GET", "PUT", "DELETE", "PATCH"])), frozenset({"http-405"})),
        "path": lambda: (_json_request(query(), path=rng.choice(["/", "/v2/search", "/v1/search/"])), frozenset({"http-404", "http-405"})),
        "query parameter": lambda: (_json_request(query(), path=rng.choice([f"/v1/search?model_version={t.version}", "/v1/search?k=3", "/v1/status?x=" + "a" * 100,
                                                                            "/healthz?verbose"]), method="GET" if rng.random() < 0.3 else "POST"), HTTP_BAD),
        "target over the limit": lambda: (_json_request(query(), path="/v1/search?" + "a" * rng.choice([9 << 10, 40 << 10])), frozenset({"http-414"})),
    }  # fmt: skip


def raw_http_cases(rng: random.Random, t: Target) -> dict:
    """Connection-level abuse on raw sockets: bytes to send, then the connection is left open."""
    body = json.dumps({"features": rows(rng, t, 1).tolist(), "k": 3}).encode()
    head = b"POST /v1/search HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\n"

    return {
        "body shorter than Content-Length": lambda: (head + b"Content-Length: %d\r\n\r\n" % (len(body) + rng.randint(1, 500)) + body[: rng.randrange(len(body))], HTTP_REFUSED),
        "TLS ClientHello": lambda: (bytes.fromhex("16030100f4010000f00303") + rng.randbytes(236), HTTP_REFUSED),
        "headers never finished": lambda: (head + b"Content-Length: 10\r\n", HTTP_REFUSED),
        "garbage request line": lambda: (rng.randbytes(rng.randrange(1, 200)) + b"\r\n\r\n", HTTP_REFUSED),
        "malformed Content-Length": lambda: (head + rng.choice([b"Content-Length: -5", b"Content-Length: abc", b"Content-Length: 5, 6", b"Content-Length: 99999999999999999999999",
                                                                 b"Content-Length: \xb2", b"Content-Length: 1\xb2", b"Content-Length: " + b"9" * 5000]) + b"\r\n\r\n" + body, HTTP_REFUSED),
        "body over the limit": lambda: (head + b"Content-Length: %d\r\n\r\n" % (t.search_max_bytes + rng.randint(1, 10**9)), HTTP_REFUSED),
        "headers over the limit": lambda: (head + b"Content-Length: 2\r\nX-Pad: " + b"a" * (70 << 10) + b"\r\n\r\n{}", frozenset({"http-431"})),
        "headers over four times the limit": lambda: (head + b"X-Pad: " + b"a" * (300 << 10) + b"\r\n\r\n", HTTP_REFUSED),
        "malformed chunked body": lambda: (head + b"Transfer-Encoding: chunked\r\n\r\n" + rng.choice([b"zz\r\n", b"5\r\nabc\r\n0\r\n\r\n", b"fffffffff\r\n"]), HTTP_REFUSED),
    }  # fmt: skip


# ----------------------------------------------------------------------------- development model server

PREDICT = "/tensorflow.serving.PredictionService/Predict"
METADATA = "/tensorflow.serving.PredictionService/GetModelMetadata"
STATUS = "/tensorflow.serving.ModelService/GetModelStatus"
RELOAD = "/tensorflow.serving.ModelService/HandleReloadConfigRequest"
HEALTH = "/grpc.health.v1.Health/Check"
SEARCH = "/tfhash.serving.HashSearch/Search"
SEARCH_STATUS = "/tfhash.serving.HashSearch/GetStatus"
#: Bytes that are no protobuf message: invalid wire types, a tag 0, a field cut short.
UNDECODABLE = (b"\x07", b"\x0e\x01", b"\x00\x01", b"\x0a\x05ab", b"\x08")


def _tensor(values: np.ndarray) -> tensor_pb2.TensorProto:
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, tensor_content=np.asarray(values, np.float32).tobytes())
    proto.tensor_shape.CopyFrom(tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in values.shape]))
    return proto


def model_cases(rng: random.Random, t: Target, allowed_root: str) -> dict:
    """category -> (method, request or bytes, expected)."""

    def predict(signature=FEATURES_SIGNATURE, **spec) -> predict_pb2.PredictRequest:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = spec.get("name", t.model_name)
        if "version" in spec:
            request.model_spec.version.value = spec["version"]
        if "label" in spec:
            request.model_spec.version_label = spec["label"]
        request.model_spec.signature_name = signature
        return request

    def valid_predict():
        request = predict(version=t.version) if rng.random() < 0.5 else predict()
        values = rows(rng, t)
        if rng.random() < 0.5:
            request.inputs[t.feature].CopyFrom(_tensor(values))
        else:
            request.model_spec.signature_name = EXAMPLES_SIGNATURE
            request.inputs[EXAMPLES_INPUT].CopyFrom(tensor_pb2.TensorProto(
                dtype=types_pb2.DT_STRING, string_val=[example(v, t.feature) for v in values],
                tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=len(values))])))  # fmt: skip
        return request

    def bad_tensor():
        values = rows(rng, t)
        request, proto, choice = predict(), _tensor(values), rng.randrange(8)
        if choice == 0:
            proto.dtype = rng.choice([999, 0, types_pb2.DT_DOUBLE, types_pb2.DT_STRING, types_pb2.DT_RESOURCE, -3])
        elif choice == 1:
            del proto.tensor_shape.dim[:]
            proto.tensor_shape.dim.extend([tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in rng.choice(
                [[t.dim], [-1, t.dim], [1, t.dim + 1], [2**32, 2**32], [1] * 40, [1, t.dim, 1], [len(values) + 1, t.dim]])])  # fmt: skip
        elif choice == 2:
            proto.tensor_shape.unknown_rank = True
        elif choice == 3:  # the short form: one value for a large shape
            proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[0.5])
            proto.tensor_shape.dim.extend([tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in (rng.choice([50_000, 10**7, 2**40]), t.dim)])
        elif choice == 4:
            proto.tensor_content = proto.tensor_content[: -rng.randint(1, 5)]
        elif choice == 5:
            proto.tensor_content = proto.tensor_content + b"\x00" * rng.randint(1, 8)
        elif choice == 6:
            proto = _tensor(poisoned(rng, rows(rng, t), rng.choice(["nonfinite", "range"])))
        else:
            proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[0.5] * 3)
            proto.tensor_shape.dim.extend([tensor_shape_pb2.TensorShapeProto.Dim(size=1), tensor_shape_pb2.TensorShapeProto.Dim(size=t.dim)])
        request.inputs[t.feature].CopyFrom(proto)
        return request

    def bad_inputs():
        request = predict()
        if rng.random() < 0.5:
            request.inputs["nope" * rng.randint(1, 50)].CopyFrom(_tensor(rows(rng, t)))
        else:
            request.inputs[t.feature].CopyFrom(_tensor(rows(rng, t)))
            request.inputs["extra"].CopyFrom(_tensor(rows(rng, t)))
        return request

    def bad_examples():
        request = predict(EXAMPLES_SIGNATURE)
        record = example(rows(rng, t, 1)[0], t.feature)
        bad = rng.choice([record[:-3], b"\x00garbage", example(poisoned(rng, rows(rng, t, 1)[0], "nonfinite"), t.feature), example([1.0], t.feature)])
        request.inputs[EXAMPLES_INPUT].CopyFrom(tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[bad],
                                                                   tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)])))  # fmt: skip
        return request

    def output_filter():
        request = valid_predict()
        request.output_filter.append(rng.choice(["nope", "", "codes2", "x" * 300]))
        return request

    def metadata(fields=("signature_def",), **spec):
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=list(fields))
        request.model_spec.name = spec.get("name", t.model_name)
        return request

    def status(**spec):
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = spec.get("name", t.model_name)
        if "version" in spec:
            request.model_spec.version.value = spec["version"]
        return request

    def reload_bad():
        request = model_management_pb2.ReloadConfigRequest()
        choice = rng.randrange(4)
        if choice == 0:
            return request, INVALID  # no model
        config = request.config.model_config_list.config.add(name=t.model_name, base_path=allowed_root, model_platform="tensorflow")
        if choice == 1:
            config.base_path = rng.choice([f"{allowed_root}/../../outside", "/etc", "/", "relative/elsewhere"])
            return request, frozenset({"PERMISSION_DENIED"})
        if choice == 2:
            request.config.model_config_list.config.add(name=t.model_name, base_path=allowed_root)
            return request, INVALID  # a name twice
        config.model_platform = rng.choice(["pytorch", "tensorflow2", "x" * 200])
        return request, INVALID

    def undecodable():
        return rng.choice([PREDICT, METADATA, STATUS, RELOAD]), rng.choice(UNDECODABLE), INVALID

    return {
        "valid predict": lambda: (PREDICT, valid_predict(), OK),
        "valid metadata and status": lambda: rng.choice([(METADATA, metadata(), OK), (STATUS, status(), OK)]),
        "unknown model or version": lambda: rng.choice([
            (PREDICT, predict(name="nope"), NOT_FOUND), (PREDICT, predict(version=t.version + 7), NOT_FOUND),
            (STATUS, status(name="x" * 1000), NOT_FOUND), (STATUS, status(version=99), NOT_FOUND), (METADATA, metadata(name=""), NOT_FOUND)]),  # fmt: skip
        "unknown label or signature": lambda: (PREDICT, rng.choice([predict(label="canary"), predict(signature="nope" * 40)]), INVALID),
        "bad tensors": lambda: (PREDICT, bad_tensor(), INVALID_OR_TOO_LARGE),
        "missing or extra inputs": lambda: (PREDICT, bad_inputs(), INVALID),
        "bad examples": lambda: (PREDICT, bad_examples(), INVALID),
        "unknown output filter": lambda: (PREDICT, output_filter(), INVALID),
        "bad metadata fields": lambda: (METADATA, metadata(rng.choice([(), ("signature_def", "x"), ("everything",)])), INVALID),
        "reload config refused": lambda: (RELOAD, *reload_bad()),
        "undecodable bytes": undecodable,
        "random bytes": lambda: (rng.choice([PREDICT, METADATA, STATUS]), rng.randbytes(rng.randrange(1, 64)), ANY),
        "oversized message": lambda: (PREDICT, b"\x0a" + b"\xff" * 4 + b"\x03" + b"x" * (t.model_max_bytes + 16), TOO_LARGE),
    }  # fmt: skip


def health_cases(rng: random.Random, t: Target) -> dict:
    """The search service's health and status methods."""
    return {
        "health check": lambda: (HEALTH, rng.choice([b"", b"\x0a\x19tfhash.serving.HashSearch"]), OK),
        "status": lambda: (SEARCH_STATUS, b"", OK),
        "unknown health service": lambda: (HEALTH, b"\x0a\x04nope", NOT_FOUND),
        "undecodable bytes": lambda: (rng.choice([HEALTH, SEARCH_STATUS]), rng.choice(UNDECODABLE), INVALID),
    }


# ------------------------------------------------------------------------------------------ running


def _grpc_outcome(call, payload: bytes, deadline: float) -> tuple[str, str]:
    try:
        call(payload, timeout=deadline)
        return "OK", ""
    except grpc.RpcError as err:
        code = err.code()
        return ("hang" if code == grpc.StatusCode.DEADLINE_EXCEEDED else code.name), err.details() or ""


def _http_outcome(port: int, method: str, path: str, headers: dict, body: bytes, deadline: float) -> tuple[str, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return f"http-{response.status}", response.read()[:300].decode(errors="replace")
    except TimeoutError:
        return "hang", ""
    except (ConnectionError, http.client.HTTPException) as err:
        return "closed", str(err)
    finally:
        connection.close()


def _raw_outcome(port: int, data: bytes, deadline: float) -> tuple[str, str]:
    """Send ``data`` and wait for an answer or a close; ``hang`` if neither comes in time."""
    with socket.create_connection(("127.0.0.1", port), timeout=deadline) as sock:
        started = time.monotonic()
        try:
            sock.sendall(data)
            received = b""
            while time.monotonic() - started < deadline:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                received += chunk
                if b"\r\n\r\n" in received:
                    break
        except TimeoutError:
            return "hang", ""
        except ConnectionError:
            return "closed", ""
    if not received:
        return ("closed", f"after {time.monotonic() - started:.1f} s") if time.monotonic() - started < deadline else ("hang", "")
    status = received.split(b"\r\n", 1)[0].split()
    return (f"http-{int(status[1])}" if len(status) > 1 and status[1].isdigit() else "closed"), received[:100].decode(errors="replace")


def _serialized(message) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def _draw(cases: dict, count: int):
    """``count`` draws spread evenly over the categories, in turn."""
    names = sorted(cases)
    for i in range(count):
        yield names[i % len(names)], cases[names[i % len(names)]]


def _grpc_target(address: str, label: str, cases: dict, count: int, tally: Tally, deadline: float) -> None:
    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1)])
    calls = {}
    for name, case in _draw(cases, count):
        method, message, expected = case()
        call = calls.setdefault(method, channel.unary_unary(method))
        got, detail = _grpc_outcome(call, _serialized(message), deadline)
        tally.record(label, name, expected, got, detail)
    channel.close()


def run(t: Target, requests: int, seed: int = 0, allowed_root: str = "/nonexistent") -> Tally:
    """Send ``requests`` fuzzed requests, split evenly between the search gRPC targets, REST
    (JSON and raw sockets) and the model server (the search service's health and status methods
    get a tenth of a share); returns the tally."""
    rng, tally, started = random.Random(seed), Tally(), time.monotonic()
    shares = len(t.search) + 2 * (t.rest_port is not None) + (t.model_server is not None)
    share = max(requests // shares, 1)
    for label, address in t.search.items():
        cases = {name: (lambda case=case: (SEARCH, *case())) for name, case in search_cases(rng, t).items()}
        _grpc_target(address, label, cases, share, tally, t.deadline)
    _grpc_target(next(iter(t.search.values())), "health", health_cases(rng, t), max(share // 10, 4), tally, t.deadline)
    if t.rest_port is not None:
        for name, case in _draw(rest_cases(rng, t), share):
            (method, path, headers, body), expected = case()
            got, detail = _http_outcome(t.rest_port, method, path, headers, body, t.deadline)
            tally.record("rest", name, expected, got, detail)
        draws = [(name, *case()) for name, case in _draw(raw_http_cases(rng, t), share)]
        deadline = 2 * t.rest_timeout + 3.0  # a slow client is cut off after the header and body timeouts
        with ThreadPoolExecutor(max_workers=32) as pool:  # slow clients hold sockets, not server threads
            outcomes = list(pool.map(lambda draw: _raw_outcome(t.rest_port, draw[1], deadline), draws))
        for (name, _, expected), (got, detail) in zip(draws, outcomes, strict=True):
            tally.record("rest-raw", name, expected, got, detail)
    if t.model_server is not None:
        _grpc_target(t.model_server, "model-server", model_cases(rng, t, allowed_root), share, tally, t.deadline)
    tally.seconds = time.monotonic() - started
    return tally
