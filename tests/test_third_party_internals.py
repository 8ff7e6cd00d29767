"""The names tfhash takes from other libraries beyond their public APIs: each one is listed in
docs/architecture.md with why, still where the tested releases have it, and no shipped module
imports another such name without a row there."""

from __future__ import annotations

import ast
import importlib
import re

import pytest

from tests.test_architecture import PACKAGES, ROOT

DOC = ROOT / "docs" / "architecture.md"
#: Modules whose names are not their library's public API (TFX's public API is ``tfx.v1`` and its
#: protos; tf.Transform's is ``tensorflow_transform`` and ``tensorflow_transform.beam``; TensorFlow's
#: protocol buffers, ``tensorflow.core...._pb2``, are the published wire format TF Serving speaks).
INTERNAL = re.compile(r"^(keras\.src|tensorflow\.python|tensorflow\.core(?!\.[a-z_.]+_pb2$)|tfx\.(?!v1\b|proto\b)[a-z_]+"
                      r"|tensorflow_transform\.(?!beam$)[a-z_.]+)")
#: Attributes set on an instance (a compiled model), which no class holds.
INSTANCE_ATTRIBUTES = {"keras.Model._compile_metrics", "keras.Model._compile_config"}


def listed() -> list[str]:
    """The names of the table of docs/architecture.md's section on other libraries' internals."""
    text = DOC.read_text()
    section = text[text.index("## What tfhash takes from other libraries beyond their public APIs"):]
    return re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", section, flags=re.MULTILINE)


def resolve(dotted: str):
    """The object ``dotted`` names: the longest importable module prefix, then attributes.

    Raises:
        AssertionError: naming the part that is gone.
    """
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for depth, attribute in enumerate(parts[cut:], cut):
            assert hasattr(target, attribute), (f"{'.'.join(parts[:depth])} has no {attribute!r} any more: tfhash relies on "
                                                f"{dotted} (docs/architecture.md says where and why); adapt that code")  # fmt: skip
            target = getattr(target, attribute)
        return target
    raise AssertionError(f"no module of {dotted} imports")


def internal_imports() -> set[str]:
    """``module.name`` of every import of a non-public module in the shipped code."""
    found = set()
    for folder in (f for f in PACKAGES if f not in ("benchmarks", "tests")):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.update(n for n in (f"{node.module}.{alias.name}" for alias in node.names) if INTERNAL.match(n))
                elif isinstance(node, ast.Import):
                    found.update(alias.name for alias in node.names if INTERNAL.match(alias.name))
    return found


def test_every_internal_name_imported_by_shipped_code_is_listed_with_its_reason():
    names = listed()
    assert len(names) == len(set(names)) >= 10
    unlisted = sorted(i for i in internal_imports() if not any(n == i or n.startswith(i + ".") for n in names))
    assert unlisted == [], f"list these in docs/architecture.md with why no public API does: {unlisted}"


@pytest.mark.parametrize("dotted", sorted(set(listed()) - INSTANCE_ATTRIBUTES))
def test_each_listed_name_is_where_the_tested_releases_have_it(dotted):
    assert resolve(dotted) is not None


def test_the_compiled_model_attributes_are_set_by_keras_compile():
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    for dotted in sorted(INSTANCE_ATTRIBUTES):
        attribute = dotted.rsplit(".", 1)[1]
        assert hasattr(model, attribute), f"keras.Model.compile no longer sets {attribute}: tfhash relies on it (docs/architecture.md)"


def test_a_moved_name_and_an_unlisted_import_fail_clearly():
    with pytest.raises(AssertionError, match="has no 'gone_in_this_release'"):
        resolve("keras.optimizers.Optimizer.gone_in_this_release")
    assert INTERNAL.match("tfx.orchestration.portable.x") and INTERNAL.match("keras.src.utils")
    assert not INTERNAL.match("tfx.v1.dsl") and not INTERNAL.match("tfx.proto.example_gen_pb2")
    assert not INTERNAL.match("tensorflow_transform.beam") and INTERNAL.match("tensorflow_transform.beam.context")
    assert not INTERNAL.match("tensorflow.core.example.example_pb2") and INTERNAL.match("tensorflow.python.saved_model")
