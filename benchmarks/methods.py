"""What the retrieval benchmarks share: fixed-feature datasets, one builder per method (the tfhash
methods and the two baselines) and train-then-score.

Every method trains the same head on the same inputs: ``mlp(d, (512,))`` (one hidden layer of 512
with dropout 0.2), Adam 1e-3, batch 128, the same seed. Inputs are standardised with the training
rows' mean and standard deviation.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfhash.data import load_mnist  # noqa: E402
from tfhash.data.splits import Split  # noqa: E402
from tfhash.labels import multi_hot  # noqa: E402
from tfhash.metrics import evaluate_retrieval  # noqa: E402
from tfhash.recipes import with_unlabelled  # noqa: E402
from tfhash.registry import TagStatistics, build_model, get_method, method_names, variant  # noqa: E402
from tfhash.training_spec import TrainingSpec  # noqa: E402

SINGLE_LABEL_METHODS = ("SCDH", "SCDH-S", "MT-SCDH", "HCLM", "sHCLM", "sHCLM+triplet", "HyP2",
                        "DPSH-style pairwise", "CNNBH-style softmax")  # fmt: skip
# MT-SCDH with another consistency weight w than the default 50 (docs/design.md s.4): "MT-SCDH w=5", "MT-SCDH w=0".
MT_VARIANTS = ("MT-SCDH w=5", "MT-SCDH w=0")
HIDDEN = (512,)
CACHE = Path(__file__).resolve().parents[1] / "runs" / "cache"
BATCH = 128


@dataclass
class FeatureData:
    """A single-label dataset as fixed input vectors with its standard split."""

    name: str
    x: np.ndarray  # (N, d) float32, standardised with the training rows' statistics
    labels: np.ndarray  # (N, C) uint8 one-hot
    split: Split
    inputs: str  # what x is, for the report

    @property
    def class_ids(self) -> np.ndarray:
        return self.labels.argmax(axis=1)

    @property
    def num_classes(self) -> int:
        return self.labels.shape[1]


def standardised(x: np.ndarray, train: np.ndarray) -> np.ndarray:
    mean, std = x[train].mean(axis=0), x[train].std(axis=0) + 1e-6
    return ((x - mean) / std).astype("float32")


def mnist_pixels(seed: int) -> FeatureData:
    ds = load_mnist(seed=seed)
    x = ds.inputs["image"].reshape(len(ds.labels), -1).astype("float32") / 255.0
    return FeatureData("MNIST", standardised(x, ds.split.train), ds.labels, ds.split, "raw pixels (784)")


def cifar_features(seed: int, size: int = 128):
    """CIFAR-10 and its frozen ImageNet SqueezeNet v1.1 features at ``size`` pixels (global average
    pool, 512-d), computed once and kept under ``runs/cache``."""
    from tfhash.data import load_cifar10
    from tfhash.models.backbones import squeezenet

    ds = load_cifar10(seed=seed)
    path = CACHE / f"cifar10_squeezenet_{size}.npy"
    if path.is_file():
        features = np.load(path, allow_pickle=False)
    else:
        start = time.perf_counter()
        net = squeezenet((size, size, 3), resize_from=(32, 32, 3))
        features = net.predict(ds.inputs["image"], batch_size=256, verbose=0).astype(np.float32)
        print(f"SqueezeNet features of 60,000 images: {time.perf_counter() - start:.0f} s", flush=True)
        CACHE.mkdir(parents=True, exist_ok=True)
        np.save(path, features, allow_pickle=False)
    return ds, features


def cifar_squeezenet(seed: int) -> FeatureData:
    ds, features = cifar_features(seed)
    return FeatureData("CIFAR-10", standardised(features, ds.split.train), ds.labels, ds.split,
                       "frozen ImageNet SqueezeNet v1.1, 128x128, global average pool (512)")  # fmt: skip


#: Benchmark rows named otherwise than a registered method's label: row name -> the method or
#: variant of :data:`tfhash.registry.VARIANTS` it trains (the multi-label rows differ by their data).
ROWS = {"sHCLM+triplet": "shclm triplet 1", "SCDH multi-label": "scdh", "SCDH + JCCH coefficients": "scdh",
        "sHCLM (balanced BCE)": "shclm"}  # fmt: skip


def method_of(row_name: str) -> tuple[str, dict]:
    """(registered method name, options) of a benchmark row: a method's label (e.g. ``"SCDH"``), a
    :data:`ROWS` entry, or ``"MT-SCDH w=<w>"`` (MT-SCDH with consistency weight w)."""
    if row_name in ROWS:
        return variant(ROWS[row_name])
    if row_name.startswith("MT-SCDH w="):
        try:
            return "mt-scdh", {"consistency": float(row_name.split("=", 1)[1])}
        except ValueError:
            raise ValueError(f"{row_name!r}: the consistency weight after 'w=' must be a number") from None
    for name in method_names():
        if get_method(name).label == row_name:
            return name, {}
    raise ValueError(f"unknown method {row_name!r}; choose one of {SINGLE_LABEL_METHODS + MT_VARIANTS + MULTI_LABEL_METHODS}, "
                     f"or a registered method's label")


def row_name(method: str, options: dict) -> str:
    """The benchmark row that trains registered ``method`` with ``options``: the variant those
    options make (sHCLM with a triplet weight is ``"sHCLM+triplet"``), else the method's label."""
    if method == "shclm" and options.get("triplet_weight"):
        return "sHCLM+triplet"
    return get_method(method).label


def head_spec(method: str, bits: int, seed: int, hidden, dropout: float, preset: str, options: dict) -> TrainingSpec:
    """The spec every benchmark row trains: registered ``method`` with ``options`` on the shared
    head (an MLP of ``hidden`` widths with ``dropout``), at ``bits`` from ``seed``."""
    return TrainingSpec(method=method, bits=bits, backbone="mlp", hidden=list(hidden), preset=preset, overrides=options, seed=seed,
                        fine_tuning={"dropout": dropout})  # fmt: skip


def benchmark_model(name: str, x_train: np.ndarray, y_train: np.ndarray, bits: int, seed: int,
                    unlabelled: np.ndarray | None = None, hidden=HIDDEN, dropout: float = 0.2, **options):  # fmt: skip
    """The model and its ``fit`` inputs for one single-label method.

    Args:
        x_train, y_train: labelled training rows and their one-hot labels.
        unlabelled: extra unlabelled rows (MT-SCDH only, which without them trains on the labelled
            rows alone; ``"MT-SCDH w=<w>"`` sets its consistency weight, 50 otherwise; input noise
            0.3 and a ramp-up over two passes over the rows unless ``options`` set
            ``noise_stddev`` / ``rampup_steps``).
        hidden, dropout: the shared head, :func:`tfhash.models.mlp`.
        options: the model's own settings over its defaults (SCDH's lam / mu / alpha, MT-SCDH's
            too and :func:`tfhash.models.build_mt_scdh`'s, HCLM's triplet_weight / margin, HyP2's
            zeta / beta); the baselines take none.

    Returns:
        ``(model, x, y)`` ready for ``model.fit(x, y)``.
    """
    method, settings = method_of(name)
    if not get_method(method).in_pipeline and method != "mt-scdh" and options:
        raise ValueError(f"{name} takes no options; got {sorted(options)}")
    keras.utils.set_random_seed(seed)
    if unlabelled is not None and method != "mt-scdh":
        raise ValueError(f"{name} trains on labelled rows only; unlabelled rows are for MT-SCDH")
    x, labels = with_unlabelled(x_train, multi_hot(y_train), unlabelled)
    settings, x, y = get_method(method).prepare(x, labels, seed, {**settings, **options})
    if method == "mt-scdh":
        settings = {"consistency": 50.0, "noise_stddev": 0.3, "rampup_steps": max(1, len(x) // BATCH * 2), **settings}
    spec = head_spec(method, bits, seed, hidden, dropout, "cifar10", {})
    return build_model(spec, {"x": x_train.shape[1:]}, labels.shape[1], options=settings), x, y


MULTI_LABEL_METHODS = ("SCDH multi-label", "SCDH + JCCH coefficients", "sHCLM (balanced BCE)", "HyP2")


def multilabel_benchmark_model(name: str, x_train: np.ndarray, y_train: np.ndarray, bits: int, seed: int,
                               hidden=(1024,), dropout: float = 0.2, **options):  # fmt: skip
    """The model and its ``fit`` inputs for one multi-label method: SCDH's multi-label SCUL with
    the ``"nuswide"`` preset (q = 1/|Y|, u = 1) or with JCCH's label coefficients
    (:func:`tfhash.losses.jcch_coefficients`), sHCLM with tag co-occurrence proxies and the
    frequency-balanced BCE, or HyP2; ``options`` as for :func:`benchmark_model`. Returns
    ``(model, x, y)``."""
    from tfhash.losses import jcch_coefficients

    method, settings = method_of(name)
    keras.utils.set_random_seed(seed)
    labels = multi_hot(y_train)
    spec = head_spec(method, bits, seed, hidden, dropout, "nuswide", {**settings, **options})
    model = build_model(spec, {"x": x_train.shape[1:]}, y_train.shape[1], statistics=TagStatistics.of_labels(y_train))
    if name == "SCDH + JCCH coefficients":
        q, u = jcch_coefficients(y_train)
        return model, x_train, {"labels": labels, "q": q.astype("float32"), "u": u.astype("float32")}
    return model, x_train, labels


def fit_and_score(model, x, y, query_x, query_y, db_x, db_y, epochs: int, seed: int, map_at=(), optimizer=None,
                  callbacks=(), precision_at: int | None = 1000) -> dict:  # fmt: skip
    """Train (``optimizer`` default Adam 1e-3), encode, evaluate (mAP@all, P@H<=2, P@N for
    ``precision_at`` unless None, and mAP@R for each R of ``map_at``) and time the training
    (callbacks' time included)."""
    model.compile(optimizer=optimizer or keras.optimizers.Adam(1e-3))
    start = time.perf_counter()
    history = model.fit(x, y, epochs=epochs, batch_size=BATCH, verbose=0, callbacks=list(callbacks))
    seconds = time.perf_counter() - start
    query_codes, db_codes = model.encode(query_x), model.encode(db_x)
    depths = [precision_at] if precision_at else []
    summary = evaluate_retrieval(query_codes, db_codes, query_y, db_y, precision_at=depths).summary()
    row = {"mAP@all": summary["mAP@all"], "P@H<=2": summary["P@H<=2"], "train_s": round(seconds, 1), "epochs": epochs,
           "seed": seed, **{f"P@{n}": summary[f"P@{n}"] for n in depths}}  # fmt: skip
    for depth in map_at:
        row[f"mAP@{depth}"] = evaluate_retrieval(query_codes, db_codes, query_y, db_y, top_r=depth).mean_average_precision()
    if "quantization" in history.history:
        row["final l_q"] = float(history.history["quantization"][-1])
    return row
