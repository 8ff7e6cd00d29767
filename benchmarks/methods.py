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

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfhash import proxies  # noqa: E402
from tfhash.data import load_mnist  # noqa: E402
from tfhash.data.splits import Split  # noqa: E402
from tfhash.metrics import evaluate_retrieval  # noqa: E402
from tfhash.models import (  # noqa: E402
    HCLMModel,
    build_hyp2,
    build_mt_scdh,
    build_pairwise,
    build_scdh,
    build_softmax_codes,
    mlp,
)

SINGLE_LABEL_METHODS = ("SCDH", "SCDH-S", "MT-SCDH", "HCLM", "sHCLM", "sHCLM+triplet", "HyP2",
                        "DPSH-style pairwise", "CNNBH-style softmax")  # fmt: skip
# MT-SCDH with another consistency weight w than DESIGN.md's 50: "MT-SCDH w=5", "MT-SCDH w=0".
MT_VARIANTS = ("MT-SCDH w=5", "MT-SCDH w=0")
HIDDEN = (512,)
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


def cifar_squeezenet(seed: int) -> FeatureData:
    from benchmarks.proxy import cifar_features

    ds, features = cifar_features(seed)
    return FeatureData("CIFAR-10", standardised(features, ds.split.train), ds.labels, ds.split,
                       "frozen ImageNet SqueezeNet v1.1, 128x128, global average pool (512)")  # fmt: skip


def build_method(name: str, x_train: np.ndarray, y_train: np.ndarray, bits: int, seed: int,
                 unlabelled: np.ndarray | None = None, hidden=HIDDEN, dropout: float = 0.2, **options):  # fmt: skip
    """The model and its ``fit`` inputs for one single-label method.

    Args:
        x_train, y_train: labelled training rows and their one-hot labels.
        unlabelled: extra unlabelled rows (MT-SCDH only; ``"MT-SCDH w=<w>"`` sets its consistency
            weight, 50 otherwise; input noise 0.3 and a ramp-up over two passes over the rows
            unless ``options`` set ``noise_stddev`` / ``rampup_steps``).
        hidden, dropout: the shared head, :func:`tfhash.models.mlp`.
        options: the model's own settings over its defaults (SCDH's lam / mu / alpha, MT-SCDH's
            too and :func:`tfhash.models.build_mt_scdh`'s, HCLM's triplet_weight / margin, HyP2's
            zeta / beta); other methods take none.

    Returns:
        ``(model, x, y)`` ready for ``model.fit(x, y)``.
    """
    keras.utils.set_random_seed(seed)
    dim, num_classes = x_train.shape[1], y_train.shape[1]
    labels = y_train.astype("float32")

    def head():
        return mlp(dim, hidden, dropout=dropout)

    if name in ("SCDH", "SCDH-S"):
        return build_scdh(head(), num_classes, bits, preset="cifar10", ablation=name == "SCDH-S", **options), x_train, labels
    if name == "MT-SCDH" or name.startswith("MT-SCDH w="):
        if unlabelled is None:
            raise ValueError("MT-SCDH needs unlabelled rows")
        try:
            consistency = 50.0 if name == "MT-SCDH" else float(name.split("=", 1)[1])
        except ValueError:
            raise ValueError(f"{name!r}: the consistency weight after 'w=' must be a number") from None
        x, y = mean_teacher_rows(x_train, labels, unlabelled, seed)
        settings = {"consistency": consistency, "noise_stddev": 0.3, "rampup_steps": max(1, len(x) // BATCH * 2), **options}
        return build_mt_scdh(head, num_classes, bits, x[:2], preset="cifar10", **settings), x, y
    if name in ("HCLM", "sHCLM", "sHCLM+triplet"):
        similarity = None if name == "HCLM" else proxies.class_mean_similarity(x_train, y_train.argmax(axis=1))
        codes = proxies.hclm_proxies(num_classes, bits, similarity=similarity, seed=seed)
        options = {"triplet_weight": 1.0 if name == "sHCLM+triplet" else 0.0, **options}
        return HCLMModel(head(), codes, **options), x_train, labels
    if name == "HyP2":
        return build_hyp2(head(), num_classes, bits, **options), x_train, labels
    if options:
        raise ValueError(f"{name} takes no options; got {sorted(options)}")
    if name == "DPSH-style pairwise":
        model = build_pairwise(head(), num_classes, bits, num_train=len(x_train))
        return model, x_train, {"labels": labels, "index": np.arange(len(x_train))}
    if name == "CNNBH-style softmax":
        return build_softmax_codes(head(), num_classes, bits, seed=seed), x_train, labels
    raise ValueError(f"unknown method {name!r}; choose one of {SINGLE_LABEL_METHODS + MT_VARIANTS}")


MULTI_LABEL_METHODS = ("SCDH multi-label", "SCDH + JCCH coefficients", "sHCLM (balanced BCE)", "HyP2")


def build_multilabel_method(name: str, x_train: np.ndarray, y_train: np.ndarray, bits: int, seed: int,
                            hidden=(1024,), dropout: float = 0.2, **options):  # fmt: skip
    """The model and its ``fit`` inputs for one multi-label method: SCDH's multi-label SCUL with
    the ``"nuswide"`` preset (q = 1/|Y|, u = 1) or with JCCH's label coefficients
    (:func:`tfhash.losses.jcch_coefficients`), sHCLM with tag co-occurrence proxies and the
    frequency-balanced BCE, or HyP2; ``options`` as for :func:`build_method`. Returns
    ``(model, x, y)``."""
    from tfhash.losses import jcch_coefficients

    keras.utils.set_random_seed(seed)
    dim, num_classes = x_train.shape[1], y_train.shape[1]
    labels = y_train.astype("float32")
    head = mlp(dim, hidden, dropout=dropout)
    if name in ("SCDH multi-label", "SCDH + JCCH coefficients"):
        model = build_scdh(head, num_classes, bits, preset="nuswide", **options)
        if name == "SCDH multi-label":
            return model, x_train, labels
        q, u = jcch_coefficients(y_train)
        return model, x_train, {"labels": labels, "q": q.astype("float32"), "u": u.astype("float32")}
    if name == "sHCLM (balanced BCE)":
        codes = proxies.hclm_proxies(num_classes, bits, similarity=proxies.tag_cooccurrence_similarity(y_train), seed=seed)
        return HCLMModel(head, codes, tag_frequencies=y_train.mean(axis=0), **options), x_train, labels
    if name == "HyP2":
        return build_hyp2(head, num_classes, bits, **options), x_train, labels
    raise ValueError(f"unknown multi-label method {name!r}; choose one of {MULTI_LABEL_METHODS}")


def mean_teacher_rows(x_labelled, y_labelled, unlabelled, seed: int, labelled_share: float = 0.5):
    """Labelled rows repeated until they are about ``labelled_share`` of the rows, plus the
    unlabelled rows with all-zero labels (MT-SCDH's marker for "no label"). Mean Teacher keeps a
    fixed labelled share per batch; repeating the labelled rows is our way of doing that with
    ``fit``'s shuffling."""
    repeats = max(1, int(round(labelled_share * len(unlabelled) / ((1 - labelled_share) * len(x_labelled)))))
    x = np.concatenate([np.tile(x_labelled, (repeats, 1)), unlabelled])
    y = np.concatenate([np.tile(y_labelled, (repeats, 1)), np.zeros((len(unlabelled), y_labelled.shape[1]), "float32")])
    order = np.random.default_rng(seed).permutation(len(x))
    return x[order], y[order]


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
