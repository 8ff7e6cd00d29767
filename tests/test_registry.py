"""The method registry: every reader (pipeline config, Trainer, benchmarks) takes its methods from
it, so adding a method is one entry plus its model."""

from __future__ import annotations

import numpy as np
import pytest

from tfhash.registry import (
    BuildInputs,
    Method,
    TagStatistics,
    build_method,
    get_method,
    method_names,
    register_method,
    unregister_method,
)


def random_proxy_model(inputs: BuildInputs, **options):
    """The example method: HCLM's loss on random (not hash-consistent) +-1 proxies."""
    from tfhash.models import HCLMModel

    proxies = np.where(np.random.default_rng(inputs.seed).random((inputs.num_classes, inputs.bits)) < 0.5, -1, 1)
    return HCLMModel(inputs.single_backbone, proxies.astype("int8"), **options)


@pytest.fixture
def example_method():
    # Adding a method: this one entry (and its model above).
    method = register_method(Method("random-proxies", "Random proxies", random_proxy_model))
    yield method
    unregister_method(method.name)


def test_the_table():
    assert method_names(in_pipeline=True) == ("scdh", "scdh-s", "jcch", "hclm", "shclm", "hyp2")
    assert method_names(cross_modal=True) == ("jcch",)
    assert method_names(label_coefficients=True) == ("scdh", "scdh-s", "jcch")
    assert {get_method(n).label for n in method_names()} >= {"SCDH", "MT-SCDH", "sHCLM", "HyP2", "DPSH-style pairwise"}
    with pytest.raises(ValueError, match="unknown method 'nope'; choose one of .*'hyp2'"):
        get_method("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_method(Method("scdh", "SCDH again", random_proxy_model))


def test_tag_statistics():
    labels = np.array([[1, 1, 0], [0, 1, 0], [0, 0, 1], [0, 1, 0]])
    stats = TagStatistics.of_labels(labels)
    assert stats.multi_label and stats.count == 4
    np.testing.assert_allclose(stats.frequencies, labels.mean(axis=0))
    assert not TagStatistics.of_labels(np.eye(3)[[0, 1, 2, 1]]).multi_label


def test_shclm_needs_multi_label_statistics_or_a_similarity():
    from tfhash.models import mlp

    inputs = BuildInputs(lambda m: mlp(6, (8,)), ["x"], 3, 16, statistics=TagStatistics.of_labels(np.eye(3)))
    with pytest.raises(ValueError, match="these are single-label"):
        build_method("shclm", inputs)
    assert build_method("shclm", inputs, similarity=np.eye(3)) is not None


def test_a_new_method_is_one_entry(example_method, tmp_path):
    """The registered example is accepted by the pipeline config, built by the Trainer and by the
    benchmarks, and trains."""
    from tfhash.pipelines.config import PipelineConfig

    from benchmarks import methods
    from tfhash.registry import build_model
    from tfhash.training_spec import TrainingSpec

    assert "random-proxies" in method_names(in_pipeline=True)
    config = PipelineConfig(name="demo", modality="x", run_dir=str(tmp_path),
                            training={"method": "random-proxies", "backbone": "mlp", "hidden": [8], "bits": 16})  # fmt: skip
    assert isinstance(config.training, TrainingSpec) and config.training.method == "random-proxies"
    model = build_model(config.training, {"x": [6]}, num_classes=3)
    assert type(model).__name__ == "HCLMModel"

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 6)).astype("float32"), np.eye(3)[rng.integers(0, 3, 32)]
    model, fit_x, fit_y = methods.benchmark_model("Random proxies", x, y, bits=16, seed=0, hidden=(8,))
    model.compile(optimizer="adam")
    history = model.fit(fit_x, fit_y, epochs=1, batch_size=16, verbose=0)
    assert np.isfinite(history.history["loss"][-1]) and model.encode(x[:4]).shape == (4, 16)


def test_an_unknown_method_is_refused_everywhere():
    from benchmarks import methods
    from tfhash.training_spec import TrainingSpec

    with pytest.raises(ValueError, match="unknown method 'random-proxies'"):
        TrainingSpec(method="random-proxies")
    with pytest.raises(ValueError, match="unknown method 'Random proxies'"):
        methods.benchmark_model("Random proxies", np.zeros((4, 6), "float32"), np.eye(3)[[0, 1, 2, 0]], 16, 0)
    from tfhash.pipelines.config import PipelineConfig

    with pytest.raises(ValueError, match="the pipeline trains"):
        PipelineConfig(name="x", modality="x", training={"method": "dpsh", "backbone": "mlp"})
    assert TrainingSpec(method="dpsh", backbone="mlp").method == "dpsh"  # a spec of the Keras API's recipes


def test_variants_are_one_table_that_the_tuner_and_the_benchmarks_read():
    from benchmarks import methods
    from tfhash.registry import VARIANTS, variant
    from tfhash.tuning.photos import PhotoSpace
    from tfhash.tuning.search import SEARCH_SPACES

    assert methods.method_of("sHCLM+triplet") == VARIANTS["shclm triplet 1"] == ("shclm", {"triplet_weight": 1.0})
    searched = {name: entry for space in (*SEARCH_SPACES.values(), PhotoSpace()) for name, entry in space.methods.items()}
    assert {name: searched[name] for name in VARIANTS if name in searched} == VARIANTS
    assert variant("hyp2") == ("hyp2", {})
    with pytest.raises(ValueError, match="unknown method or variant 'shclm triplet 9'"):
        variant("shclm triplet 9")


def test_one_builder_makes_every_backbone_and_the_training_rows_hooks():
    """build_model is the one maker of backbones: MLP towers named for their inputs, the spec's
    input maps adapted in the model only when rows are given; a method's training-data hook draws
    its options from the rows."""
    from tfhash.registry import build_model, get_method
    from tfhash.training_spec import TrainingSpec

    rng = np.random.default_rng(0)
    rows = {"image": rng.normal(size=(40, 6)).astype("float32"), "text": rng.normal(size=(40, 5)).astype("float32")}
    spec = TrainingSpec(method="jcch", bits=16, backbone="mlp", hidden={"image": [8], "text": [4]}, input_map={"text": "standardise"},
                        fine_tuning={"dropout": 0.25})  # fmt: skip
    model = build_model(spec, {"image": (6,), "text": (5,)}, 3, input_rows=rows)
    names = [layer.name for layer in model._flatten_layers()]
    assert "backbone_image" in names and "backbone_text" in names and "backbone_text_standardise" in names
    assert "backbone_image_standardise" not in names  # a tower the input map does not name passes unmapped
    unmapped = build_model(spec, {"image": (6,), "text": (5,)}, 3)  # the pipeline: Transform maps the inputs
    assert "backbone_text_standardise" not in [layer.name for layer in unmapped._flatten_layers()]

    labels = np.eye(3, dtype="float32")[rng.integers(0, 3, 40)]
    options, x, y = get_method("dpsh").prepare(rows["image"], labels, 0, {})
    assert options == {"num_train": 40} and np.array_equal(y["index"], np.arange(40))
    options, _, _ = get_method("shclm").prepare(rows["image"], labels, 0, {})
    assert options["similarity"].shape == (3, 3)
    assert get_method("hyp2").prepare(rows["image"], labels, 0, {"beta": 2.0})[0] == {"beta": 2.0}


def test_the_command_line_lists_registered_methods(example_method):
    from click.testing import CliRunner

    from tfhash.cli import main

    result = CliRunner().invoke(main, ["methods"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines()}
    assert "random-proxies" in lines and "in_pipeline" in lines["random-proxies"]
    assert "cross_modal" in lines["jcch"] and "in_pipeline" not in lines["dpsh"]
