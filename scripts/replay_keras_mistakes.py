"""Replay the mistakes a new user made with the Keras API and print what each gets now.

    .venv/bin/python scripts/replay_keras_mistakes.py

Each case states the mistake, what used to happen, and what happens now: the error's type and
message, or the result when the call is now meant to work. The script exits 1 when a case does not
behave as the library promises (so a test runs it), 0 otherwise. Data: scikit-learn's digits
(offline), a one-hidden-layer SCDH model, 16 bits, seed 0.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import tfhash.models as models  # noqa: E402
from tfhash.index import index_factory, load_index  # noqa: E402
from tfhash.recipes import recommended  # noqa: E402

logging.getLogger("tensorflow").setLevel(logging.ERROR)  # no retracing notes between the cases
TFHASH = str(Path(sys.executable).with_name("tfhash"))
BITS, SEED = 16, 0
failures: list[str] = []


def case(mistake: str, before: str, call, expect: str = "error") -> None:
    """Run ``call`` and print the outcome; ``expect`` is "error" or "works"."""
    print(f"\n* {mistake}\n  before: {before}")
    try:
        outcome = call()
    except Exception as err:  # the point of the script: show whatever the call raises
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"  now:    {type(err).__name__}: {first[:400]}")
        if expect != "error":
            failures.append(mistake)
        return
    print(f"  now:    works: {outcome}")
    if expect != "works":
        failures.append(mistake)


def digits():
    data = load_digits()
    return (data.data / 16).astype("float32"), data.target


def scdh(bits: int = BITS):
    keras.utils.set_random_seed(SEED)
    model = models.build_scdh(models.mlp(64, (64,)), 10, bits)
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    return model


def trained_codes(labels) -> np.ndarray:
    x, _ = digits()
    model = scdh()
    keras.utils.set_random_seed(SEED)
    model.fit(x, labels, epochs=2, batch_size=128, verbose=0)
    return model.encode(x)


def cli(*args: str) -> str:
    start = time.perf_counter()
    run = subprocess.run([TFHASH, *args], capture_output=True, text=True, check=False, cwd=tempfile.gettempdir())
    seconds = time.perf_counter() - start
    text = (run.stderr.strip() or run.stdout.strip()).splitlines()
    return f"exit {run.returncode} after {seconds:.1f} s: {text[-1] if text else ''}"


def main() -> int:
    x, y = digits()
    one_hot = np.eye(10, dtype="float32")[y]

    print("Labels")
    case("integer class ids (n,)", "InvalidArgumentError ... Incompatible shapes: [128] vs. [128,10] inside fit",
         lambda: f"codes equal to training on the one-hot: {bool((trained_codes(y) == trained_codes(one_hot)).all())}",
         expect="works")  # fmt: skip
    case("ids as an (n, 1) float column", "trained without an error, mAP 0.103",
         lambda: scdh().fit(x, y[:, None].astype("float32"), verbose=0))
    case("a one-hot of the wrong width (5 of 10 classes)", "Dimensions must be equal, but are 4 and 5 for '{{node mul}}'",
         lambda: scdh().fit(x, np.eye(5)[y % 5], verbose=0))
    case("an id out of range", "(not reported)", lambda: scdh().fit(x, np.where(y == 9, 10, y), verbose=0))
    case("all-zero label rows", "trained, the rows silently counted as unlabelled",
         lambda: scdh().fit(x, np.where((np.arange(len(y)) % 50 == 0)[:, None], 0.0, one_hot), verbose=0))

    print("\nNon-finite input")
    nan_rows = x.copy()
    nan_rows[::10] = np.nan
    case("10% NaN rows in the training features", "no error; a kernel weight became NaN, every code the same",
         lambda: scdh().fit(nan_rows, y, verbose=0))
    case("encode of all-NaN input", "a valid-looking code", lambda: scdh().encode(np.full((2, 64), np.nan, "float32")))

    def diverge():
        model = models.build_scdh(models.mlp(64, (64,)), 10, BITS)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=1e38))
        model.fit(x, y, epochs=1, verbose=0)

    case("a step that makes a weight non-finite (learning rate 1e38)", "trained on, NaN codes", diverge)

    print("\nBits")
    case("build_scdh(..., bits=30)", "built and trained; failed only at index or metric time", lambda: scdh(bits=30))
    case("tfhash quickstart --bits 30", "trained, encoded 70,000 images, then a traceback after 60 s",
         lambda: (_ for _ in ()).throw(RuntimeError(cli("quickstart", "--bits", "30"))))

    print("\nSaving")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.keras")
        model = scdh()
        model.fit(x, y, epochs=1, verbose=0)
        model.save(path)
        load = "import keras, numpy as np{}; m = keras.saving.load_model({!r}); print(m.encode(np.zeros((1, 64), 'float32')).tolist())"
        for imports, expect in (("", "error"), (", tfhash.models", "works")):
            script = load.format(imports, path)

            def run(script=script):
                done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
                if done.returncode:
                    raise RuntimeError(done.stderr.strip().splitlines()[-1])
                return f"codes {done.stdout.strip()}, same as before saving: {done.stdout.strip() == str(model.encode(np.zeros((1, 64), 'float32')).tolist())}"

            case(f"keras.saving.load_model in a new process{' after import tfhash.models' if imports else ' without importing tfhash'}",
                 "Could not locate class 'SCDHModel' (after import tfhash.models: 'BackboneRateAdam')" if imports else
                 "Could not locate class 'SCDHModel' (Keras cannot know a class no import registered)", run, expect)  # fmt: skip

    print("\ncompile")
    case("compile(loss='categorical_crossentropy')", "accepted and silently ignored",
         lambda: scdh().compile(optimizer="adam", loss="categorical_crossentropy"))

    def metrics():
        model = scdh()
        model.compile(optimizer=keras.optimizers.Adam(1e-3), metrics=["accuracy", "precision_h2"])
        model.fit(x, y, epochs=2, verbose=0)
        result = model.evaluate(x, y, verbose=0, return_dict=True)
        return {k: round(v, 3) for k, v in result.items() if k in ("accuracy", "precision_h2")}

    case("compile(metrics=['accuracy'])", "metrics=['accuracy'] of length 1 whereas the model has 3 outputs", metrics, "works")
    case("encode of a Python list", "refused", lambda: scdh().encode(x[:2].tolist()).tolist(), "works")

    print("\nRecipes")

    def recipe():
        model = recommended("single-label").fit(x, y, bits=BITS, seed=SEED, epochs=3)
        steps = 3 * int(np.ceil(len(x) / 128))
        return f"trained {len(model.history.history['loss'])} epochs; learning rate at the last step {float(model.optimizer._learning_rate(steps)):.1e}"

    case("recommended(kind) names a method but nothing trains it; cosine over the recipe's 100 epochs when training 3",
         "write the build, compile and fit by hand; the rate still high when training stops", recipe, "works")  # fmt: skip

    print("\nIndexes")
    codes = np.where(np.random.default_rng(SEED).random((100, BITS)) < 0.5, -1, 1).astype(np.int8)
    index = index_factory(BITS, "BFlat")
    index.add(codes)

    def unpack():
        distances, ids = index.search(codes[:2], 3)
        return f"distances {distances.tolist()}, ids {ids.tolist()}, len(index) = {len(index)}"

    case("distances, ids = index.search(q, k); len(index)", "cannot unpack non-iterable SearchResult object; no len",
         unpack, "works")
    with tempfile.TemporaryDirectory() as folder:
        index.save(os.path.join(folder, "i"), model_version="1", signature_fingerprint="model-a")
        case("load_index of an index another model (same version string) built", "loaded silently",
             lambda: load_index(os.path.join(folder, "i"), expected_model_version="1", expected_signature_fingerprint="model-b"))

    print("\nCommand line")
    case("tfhash methods", "4.8 s (the other commands 0.3-0.6 s)",
         lambda: f"{cli('methods').split(':')[0]}; tfhash --help: {cli('--help').split(':')[0]}", "works")
    case("tfhash evaluate --help", "did not name the .npz arrays",
         lambda: "names " + ", ".join(a for a in ("query_codes", "db_codes", "query_labels", "db_labels")
                                      if a in subprocess.run([TFHASH, "evaluate", "--help"], capture_output=True, text=True).stdout),
         "works")  # fmt: skip
    case("error prefixes", "'error:' in one command, 'Error:' in others",
         lambda: "; ".join(cli(*args).split(": ", 1)[1] for args in (("index", "info", "/nonexistent"),
                                                                    ("data", "info", "mnist", "--data-root", "/nonexistent"))),
         "works")  # fmt: skip

    print(f"\n{len(failures)} case(s) not as promised" + (f": {failures}" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
