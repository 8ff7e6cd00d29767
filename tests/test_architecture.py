"""The dependency rule between tfhash's layers, read from the import statements of every module
(function-level imports included), and the contract module's own promises.

    library (tfhash.*)  <-  contract (tfhash.artifacts)  <-  stages: components | pipelines | serving
                                                          <-  entry points: tfhash.cli, benchmarks

* the contract imports no other tfhash module but :data:`LEAVES` (any layer may read its names);
* inside the library, the building blocks (layers, losses, metrics, codes, indexes) import nothing
  that trains or tunes, nor the command line (:data:`BUILDING_BLOCKS`, :data:`TRAINING`);
* a leaf (``tfhash.storage``: where a file lives, a path or a URI) imports no tfhash module;
* the library imports no stage and no entry point;
* a stage imports the library and the contract, never another stage; the one composition edge is
  the pipeline definition, which names the components it runs (:data:`COMPOSITION`);
* the entry points (the command line, the benchmarks) drive the stages and may import any of them;
* the benchmarks only measure: they import no test code (``tests/``), and the tests' helpers (the
  fuzz oracle, the robustness scenarios, the fixtures) import no benchmark but its results writer
  (``benchmarks.common``) and the certificates it makes (``benchmarks.certificates``, which the
  fault campaign's strangers need too); the test files themselves may import the benchmarks they test.

And no module reaches itself through imports: the graph has no circle (:func:`circles`).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Source folder -> the package it is installed as (pyproject.toml's package-dir).
PACKAGES = {"tfhash": "tfhash", "components": "tfhash.components", "pipelines": "tfhash.pipelines",
            "serving": "tfhash.serving", "benchmarks": "benchmarks", "tests": "tests"}  # fmt: skip
STAGES = ("components", "pipelines", "serving")
#: (importing module, imported module) pairs allowed across stages: the pipeline is its components.
#: Library modules that import no tfhash module, which the contract may build on.
LEAVES = {"tfhash.storage"}
#: Library modules (and packages) that models are made of, and those that train, tune or drive them:
#: a building block imports none of the latter.
BUILDING_BLOCKS = ("tfhash.layers", "tfhash.losses", "tfhash.metrics", "tfhash.codes", "tfhash.hamming", "tfhash.index")
TRAINING = ("tfhash.recipes", "tfhash.training_spec", "tfhash.fine_tuning", "tfhash.trunk_cache", "tfhash.tuning", "tfhash.cli")
COMPOSITION = {("tfhash.pipelines.pipeline", "tfhash.components.index_builder"),
               ("tfhash.pipelines.pipeline", "tfhash.components.record_filter"),
               ("tfhash.pipelines.pipeline", "tfhash.components.retrieval_evaluator")}  # fmt: skip


def layer(module: str) -> str | None:
    """The layer of a module name, None outside the project (third-party, standard library)."""
    parts = module.split(".")
    if parts[0] == "benchmarks":
        return "entry"
    if parts[0] == "tests":
        return "tests"
    if parts[0] != "tfhash":
        return None
    if len(parts) == 1:
        return "library"
    if parts[1] == "artifacts":
        return "contract"
    if parts[1] == "cli":
        return "entry"
    return parts[1] if parts[1] in STAGES else "library"


def imported_modules(source: str, module: str, known: set[str], runtime: bool = False) -> set[str]:
    """The project modules that ``source``'s ``import`` / ``from ... import`` statements name,
    anywhere in it (relative imports resolved against ``module``); ``from package import name``
    names the module ``package.name`` where that is one of ``known``, else ``package``. With
    ``runtime``, those under ``if TYPE_CHECKING:`` (read by type checkers only) are left out."""
    tree = ast.parse(source)
    typing_only = set()
    if runtime:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                typing_only.update(id(inner) for child in node.body for inner in ast.walk(child))
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    return found


def within(module: str, roots) -> bool:
    """``module`` is one of ``roots`` or inside one of them."""
    return any(module == root or module.startswith(root + ".") for root in roots)


def violations(modules: dict[str, str]) -> list[str]:
    """``importer -> imported: why`` for every import that breaks the rule (module docstring);
    ``modules``: module name -> its source."""
    known = set(modules)
    broken = []
    for importer, source in sorted(modules.items()):
        source_layer = layer(importer)
        for imported in sorted(imported_modules(source, importer, known)):
            target_layer = layer(imported)
            if target_layer is None or imported not in known:
                continue
            if importer in LEAVES:
                broken.append(f"{importer} -> {imported}: a leaf imports no tfhash module")
            elif source_layer == "contract" and imported != importer and target_layer != "contract" and imported not in LEAVES:
                broken.append(f"{importer} -> {imported}: the contract imports no other tfhash module")
            elif within(importer, BUILDING_BLOCKS) and within(imported, TRAINING):
                broken.append(f"{importer} -> {imported}: a building block imports nothing that trains, tunes or runs commands")
            elif source_layer == "library" and target_layer not in ("library", "contract"):
                broken.append(f"{importer} -> {imported}: the library imports no stage or entry point")
            elif (source_layer in STAGES and target_layer not in ("library", "contract", source_layer)
                  and (importer, imported) not in COMPOSITION):  # fmt: skip
                broken.append(f"{importer} -> {imported}: a stage imports no other stage ({source_layer} -> {target_layer})")
            elif importer.startswith("benchmarks") and target_layer == "tests":
                broken.append(f"{importer} -> {imported}: the benchmarks import no test code")
            elif (source_layer == "tests" and not importer.rsplit(".", 1)[-1].startswith("test_")
                  and imported.startswith("benchmarks") and imported not in ("benchmarks", "benchmarks.common", "benchmarks.certificates")):  # fmt: skip
                broken.append(f"{importer} -> {imported}: a test helper imports no benchmark but benchmarks.common and benchmarks.certificates")
    return broken


def circles(modules: dict[str, str]) -> list[list[str]]:
    """The import circles among ``modules`` (name -> source): each a sorted list of the modules
    that reach one another through imports (strongly connected components of two or more, found
    by Tarjan's algorithm; function-level imports count, as they do at run time, and imports under
    ``if TYPE_CHECKING:`` do not)."""
    known = set(modules)
    graph = {name: sorted(imported_modules(source, name, known, runtime=True) & known - {name}) for name, source in modules.items()}
    order, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in order:
            continue
        work = [(root, iter(graph[root]))]
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is not None:
                if successor not in order:
                    order[successor] = low[successor] = len(order)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(graph[successor])))
                elif successor in on_stack:
                    low[node] = min(low[node], order[successor])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == order[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def project_modules(root: Path = ROOT) -> dict[str, str]:
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root / folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            modules[".".join([package, *parts])] = path.read_text()
    return modules


def test_the_import_graph_follows_the_dependency_rule():
    modules = project_modules()
    assert "tfhash.artifacts" in modules and "tfhash.serving.searcher" in modules and "benchmarks.peers" in modules
    assert "tests.serving_fuzz" in modules and "tests.test_architecture" in modules
    assert violations(modules) == []


def test_no_module_reaches_itself_through_imports():
    assert circles(project_modules()) == []


def test_a_circle_through_a_function_level_import_is_found():
    modules = {"tfhash.a": "from tfhash.b import x\n", "tfhash.b": "def f():\n    import tfhash.c\n",
               "tfhash.c": "from tfhash import a\n", "tfhash.d": "from tfhash.a import y\n", "tfhash": ""}  # fmt: skip
    assert circles(modules) == [["tfhash.a", "tfhash.b", "tfhash.c"]]
    assert circles({**modules, "tfhash.c": ""}) == []
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tfhash import a\n"
    assert circles({**modules, "tfhash.c": typing_only}) == []  # read by type checkers only: no edge at run time


@pytest.mark.parametrize(("importer", "source", "why"), [
    ("tfhash.serving.cli", "def f():\n    from tfhash.pipelines.config import PipelineConfig\n", "a stage imports no other stage"),
    ("tfhash.serving.versions", "from tfhash.components import export\n", "a stage imports no other stage"),
    ("tfhash.pipelines.runner", "import tfhash.serving.deployment\n", "a stage imports no other stage"),
    ("tfhash.components.trainer", "from ..serving import client\n", "a stage imports no other stage"),
    ("tfhash.index.base", "from tfhash.components.encoding import encode_split\n", "the library imports no stage"),
    ("tfhash.models.scdh", "from tfhash import cli\n", "the library imports no stage or entry point"),
    ("tfhash.layers.input_maps", "from tfhash.fine_tuning import FineTuning\n", "a building block imports nothing that trains"),
    ("tfhash.index.base", "def f():\n    from tfhash.tuning import tune\n", "a building block imports nothing that trains"),
    ("tfhash.losses", "import tfhash.cli\n", "a building block imports nothing that trains"),
    ("tfhash.artifacts", "from tfhash.codes import pack_codes\n", "the contract imports no other tfhash module"),
    ("tfhash.storage", "from tfhash.artifacts import ID\n", "a leaf imports no tfhash module"),
    ("benchmarks.serving", "def f():\n    from tests.serving_fixtures import stop_cli\n", "the benchmarks import no test code"),
    ("tests.serving_fixtures", "from benchmarks.serving import run_level\n", "a test helper imports no benchmark"),
])
def test_the_rule_catches_an_import_across_stages(importer, source, why):
    modules = {**{name: "" for name in project_modules()}, importer: source}
    broken = violations(modules)
    assert len(broken) == 1 and broken[0].startswith(f"{importer} -> ") and why in broken[0]


def test_allowed_imports_are_not_flagged():
    modules = {"tfhash.serving.x": "from tfhash.artifacts import CODES\nfrom tfhash.index import load_index\n"
                                   "from tfhash.serving.errors import invalid\nimport numpy\n",
               "tfhash.pipelines.pipeline": "from tfhash.components.index_builder import IndexBuilder\n",
               "tfhash.components.index_builder": "", "tfhash.artifacts": "import os\n", "tfhash.index": "",
               "tfhash.serving.errors": "", "benchmarks.x": "from tfhash.serving.x import y\nfrom tfhash.pipelines import z\n",
               "tfhash.cli": "from tfhash.serving.x import y\n", "tfhash.pipelines.z": "",
               "tests.test_x": "from benchmarks.x import y\n", "tests.helper": "from benchmarks.common import write_results\n",
               "benchmarks.common": ""}  # fmt: skip
    assert violations(modules) == []


def test_graph_code_packing_is_tfhash_codes_bit_for_bit():
    import tensorflow as tf

    from tfhash.artifacts import BINARY_CODES, CODES, PACKED_CODES, code_outputs
    from tfhash.codes import pack_codes, sign_codes

    rng = np.random.default_rng(0)
    for bits in (8, 16, 64, 128):
        codes = rng.normal(size=(37, bits)).astype(np.float32)
        codes[0, :] = 0.0  # sign(0) = +1
        codes[1, ::3] = -0.0
        out = code_outputs(tf.constant(codes), bits)
        np.testing.assert_array_equal(out[PACKED_CODES].numpy(), pack_codes(sign_codes(codes)))
        np.testing.assert_array_equal(out[BINARY_CODES].numpy(), sign_codes(codes))
        assert out[PACKED_CODES].dtype == tf.uint8 and out[BINARY_CODES].dtype == tf.int8
        np.testing.assert_array_equal(out[CODES].numpy(), codes)


def test_signature_names():
    import tensorflow as tf

    from tfhash import artifacts

    assert artifacts.EXAMPLES_SIGNATURE == tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
    assert artifacts.examples_signature() == artifacts.EXAMPLES_SIGNATURE
    assert artifacts.features_signature() == artifacts.FEATURES_SIGNATURE
    assert artifacts.pixels_signature() == artifacts.PIXELS_SIGNATURE
    names = {f(m) for f in (artifacts.examples_signature, artifacts.features_signature, artifacts.pixels_signature)
             for m in (None, "image", "text")}  # fmt: skip
    assert len(names) == 9  # no two signatures share a name


def test_index_layout():
    from tfhash.artifacts import index_dir, index_name, index_versions_dir

    assert index_dir("/base", 3, "BFlat") == os.path.join("/base", "3", "BFlat")
    assert index_dir("/base", "3", "BFlat", "text") == os.path.join(index_versions_dir("/base", 3), index_name("BFlat", "text"))
    assert index_name("BFlat", "text") == "BFlat-text"


def test_a_run_on_remote_storage_keeps_there_all_but_what_must_be_a_local_file(tmp_path, monkeypatch):
    from tfhash.artifacts import RunLayout

    monkeypatch.setenv("TFHASH_CACHE_DIR", str(tmp_path / "cache"))
    remote = RunLayout("gs://bucket/runs/x/", "demo")
    assert (remote.data, remote.pipeline_root, remote.serving, remote.indexes, remote.summary) == (
        "gs://bucket/runs/x/data", "gs://bucket/runs/x/pipeline_root", "gs://bucket/runs/x/serving/demo",
        "gs://bucket/runs/x/indexes/demo", "gs://bucket/runs/x/summary.json")  # fmt: skip
    assert remote.remote and remote.trunk_cache is None  # the Trainer's memory maps: the cache folder of its machine
    assert remote.metadata.startswith(str(tmp_path / "cache" / "runs" / "demo-")) and remote.metadata.endswith("metadata.sqlite")
    assert RunLayout("gs://bucket/runs/y", "demo").metadata != remote.metadata  # one store per run directory
    local = RunLayout(str(tmp_path / "run"), "demo", "gs://bucket/data")
    assert not local.remote and local.data == "gs://bucket/data" and local.metadata == str(tmp_path / "run" / "metadata.sqlite")


def test_run_layout_of_a_config_file_is_the_pipelines(tmp_path):
    import json

    from tfhash.pipelines.config import PipelineConfig

    from tfhash.artifacts import RunLayout

    folder = tmp_path / "configs"
    folder.mkdir()
    (tmp_path / "exported").mkdir()
    (tmp_path / "exported" / "metadata.json").write_text('{"num_classes": 2, "modalities": {}}')
    for extra in ({"dataset": "mnist"}, {"run_dir": "../runs/x", "data_dir": "../exported"}, {"run_dir": str(tmp_path / "abs")}):
        path = folder / "c.json"
        path.write_text(json.dumps({"name": "demo", **extra}))
        assert RunLayout.from_config_file(path) == PipelineConfig.load(path).layout
    path.write_text(json.dumps({"dataset": "mnist"}))
    with pytest.raises(ValueError, match="non-empty string 'name'"):
        RunLayout.from_config_file(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read the pipeline config"):
        RunLayout.from_config_file(path)


def test_record_specs_parse_what_the_export_writes():
    import tensorflow as tf

    from tfhash.artifacts import ID, IMAGE, LABELS, VECTOR, label_spec, modality_spec
    from tfhash.data.export import to_example

    image = np.arange(12, dtype=np.uint8).reshape(3, 4)
    example = to_example({"image": image, "text": np.array([0.5, -1.0], np.float32)}, np.array([0, 1, 1]), 7)
    spec = {**label_spec(), "image": modality_spec(IMAGE, [3, 4]), "text": modality_spec(VECTOR, [2])}
    parsed = tf.io.parse_single_example(example.SerializeToString(), spec)
    assert parsed[ID].numpy().tolist() == [7] and tf.sparse.to_dense(parsed[LABELS]).numpy().tolist() == [1, 2]
    assert tf.io.decode_png(parsed["image"]).numpy()[..., 0].tolist() == image.tolist()
    assert parsed["text"].numpy().tolist() == [0.5, -1.0]
    with pytest.raises(ValueError, match="neither 'image' nor 'vector'"):
        modality_spec("audio", [3])
