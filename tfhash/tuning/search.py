"""What :func:`tfhash.tuning.tune` searches and scores: the search spaces, the budget, the
validation split carved from the training rows, the task every trial trains and scores, and the
rule that keeps the recommended recipe unless a trial beats it (:func:`beats`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields, replace

import numpy as np

from tfhash.labels import multi_hot
from tfhash.recipes import (
    MEAN_TEACHER,
    RECOMMENDED,
    SCHEDULES,
    Recipe,
    check_classes,
    check_training_rows,
    with_unlabelled,
)
from tfhash.registry import variant
from tfhash.training_spec import PHOTOS, PIPELINE_KINDS, TrainingSpec

__all__ = ["OBJECTIVE", "TRAIN_IN_DATABASE", "HELD_OUT", "KEEP_RECOMMENDED_WITHIN", "beats", "TuningError", "SAME", "SearchSpace", "SEARCH_SPACES", "hyperparameters_of", "Budget", "TuneResult", "data_kind", "are_photos", "carve_validation", "TuningTask", "tuned_recipe", "prepare"]


#: Objective of the search: mAP@all on the validation split (maximised).
OBJECTIVE = "val_map"
#: Share of the validation database drawn from the rows trained on (a catalogue holds what the
#: model was trained on; the protocols put 8% (CIFAR-10) to 55% (MIRFlickr) there).
TRAIN_IN_DATABASE = 0.5
#: Share of the training rows held out for validation (of each class when the classes are of one
#: size); half of them are the validation queries (a quarter on multi-label data).
HELD_OUT = 0.2
#: A validation split needs at least this many held-out rows per class (classes of one size) or in all.
MIN_HELD_OUT = {"single": 4, "multi": 20}
MAP_DEPTH = 1000
#: The recommended recipe is kept unless another trial beats it on validation by this much (about
#: one seed's spread of mAP@all on the shared datasets: a smaller gain is as likely noise).
KEEP_RECOMMENDED_WITHIN = 0.005


def beats(challenger: dict[str, float], incumbent: dict[str, float], margin: float = KEEP_RECOMMENDED_WITHIN) -> bool:
    """Whether a trial's validation scores replace the incumbent's (the recommended recipe's): its
    objective (:data:`OBJECTIVE`) higher by ``margin`` or more, and no other score the incumbent
    recorded (each direction of cross-modal data, mAP@1000 of multi-label data) lower by more than
    ``margin``. A gain in the mean of two directions that trades one for the other is as likely
    noise of the small validation split as a better recipe (on Wiki such a choice lost image->text
    on test: ``benchmarks/results/tuning.md``).
    """
    others = [name for name in incumbent if name != OBJECTIVE]
    return challenger[OBJECTIVE] - incumbent[OBJECTIVE] >= margin and all(challenger[name] >= incumbent[name] - margin for name in others)


class TuningError(ValueError):
    """The search cannot run (empty space, too few labelled rows) or every trial failed."""


#: The ``second_hidden`` value of a second tower as wide as the first.
SAME = "same"


#: The prefix of the hyperparameters that search a further fine-tuning setting (:attr:`SearchSpace.fine_tuning`).
FINE_TUNING = "fine_tuning."


def _hidden_text(hidden: tuple[int, ...]) -> str:
    return "-".join(str(width) for width in hidden) or "linear"


def _widths(text) -> tuple[int, ...]:
    return () if str(text) == "linear" else tuple(int(w) for w in str(text).split("-"))


@dataclass(frozen=True)
class SearchSpace:
    """The settings a search draws from for one kind of data.

    Args:
        methods: ``{variant: (registered method, its builder options)}``; a variant is one
            method with one set of its own settings (e.g. sHCLM with triplet weight 2).
        hidden, dropout, learning_rate, weight_decay, schedule, epochs: the
            :class:`tfhash.recipes.Recipe` values to choose among.
        input_dropout: input dropout of the first modality's tower (cross-modal data).
        second_hidden: the widths of the second modality's tower (cross-modal data, in sorted
            order: Wiki's text), ``None`` for the same as ``hidden``; searched when it holds more
            than ``None``. On Wiki this tower encodes the database of image queries and the text
            queries, so its capacity trades one direction for the other.
        input_map: the input maps of every tower (:data:`tfhash.towers.INPUT_MAPS`), adapted
            to each trial's training rows; the pipeline's search keeps ``"none"`` only.
        semi_supervised: the variants (of MT-SCDH) that train on unlabelled rows too: searched only
            when there are some. Every other variant trains on the labelled rows alone, an MT-SCDH
            one too (its input noise and averaged teacher then regularise supervised training).
        fine_tuning: ``{setting: values}`` of further :class:`tfhash.fine_tuning.FineTuning`
            settings to search (the recipe's ``fine_tuning``), e.g. ``{"weight_averaging": (0.0, 0.99)}``;
            each is the hyperparameter ``fine_tuning.<setting>``.
    """

    methods: dict[str, tuple[str, dict]]
    hidden: tuple[tuple[int, ...], ...] = ((1024,), (1024, 1024))
    dropout: tuple[float, ...] = (0.0, 0.2, 0.5)
    learning_rate: tuple[float, ...] = (3e-4, 1e-3, 3e-3)
    weight_decay: tuple[float, ...] = (0.0, 0.01, 0.05)
    schedule: tuple[str, ...] = SCHEDULES
    epochs: tuple[int, ...] = (20, 50, 100)
    input_dropout: tuple[float, ...] = (0.0,)
    second_hidden: tuple[tuple[int, ...] | None, ...] = (None,)
    input_map: tuple[str, ...] = ("none",)
    semi_supervised: tuple[str, ...] = ()
    fine_tuning: dict[str, tuple] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from tfhash.fine_tuning import FineTuning
        from tfhash.registry import get_method

        known = sorted({f.name for f in fields(FineTuning)} - {f.name for f in fields(Recipe)} - {"trunk_cache"})
        if set(self.fine_tuning) - set(known):
            raise TuningError(f"fine_tuning searches {sorted(set(self.fine_tuning) - set(known))}; it takes further FineTuning "
                              f"settings {known} (the recipe's own are the space's fields)")  # fmt: skip

        unknown = sorted(set(self.semi_supervised) - set(self.methods))
        if unknown:
            raise TuningError(f"semi_supervised names {unknown}, which are no variants of the space ({sorted(self.methods)})")
        wrong = [v for v in self.semi_supervised if not get_method(self.methods[v][0]).semi_supervised]
        if wrong:
            raise TuningError(f"semi_supervised variants {wrong} are of methods that take no unlabelled rows; "
                              "name MT-SCDH variants there")  # fmt: skip

    def restricted(self, in_pipeline: bool = False, semi_supervised: bool = False) -> SearchSpace:
        """The space without the variants the caller cannot train: those the TFX pipeline does not
        (``in_pipeline``), and the :attr:`semi_supervised` ones unless there are unlabelled rows.

        Raises:
            TuningError: no method is left.
        """
        from tfhash.registry import get_method

        kept = {variant: (name, options) for variant, (name, options) in self.methods.items()
                if (get_method(name).in_pipeline or not in_pipeline) and (semi_supervised or variant not in self.semi_supervised)}  # fmt: skip
        if not kept:
            raise TuningError(f"the search space has no method to train (methods {sorted(self.methods)}, in_pipeline={in_pipeline}, "
                              f"unlabelled rows: {semi_supervised}); add a method the caller can train")  # fmt: skip
        return replace(self, methods=kept, semi_supervised=tuple(v for v in self.semi_supervised if v in kept),
                       input_map=("none",) if in_pipeline else self.input_map)  # fmt: skip

    def hyperparameters(self, default: Recipe | None = None):
        """The space as ``keras_tuner.HyperParameters``; ``default`` (a recipe whose method is a
        variant of the space) gives each setting's default value, the first trial's values (a
        value the space does not hold: the space's first).

        Raises:
            TuningError: an empty setting.
        """
        return hyperparameters_of(self.choices(), {} if default is None else self.values_of(default))

    def choices(self) -> dict[str, tuple]:
        """``{hyperparameter name: values}`` as KerasTuner holds them (strings, numbers); the input
        map only where the space searches one (so a space without maps draws its trials as before)."""
        return {"variant": tuple(self.methods), "hidden": tuple(_hidden_text(h) for h in self.hidden), "dropout": self.dropout,
                "learning_rate": self.learning_rate, "weight_decay": self.weight_decay, "schedule": self.schedule,
                "epochs": self.epochs, "input_dropout": self.input_dropout,
                **({"input_map": self.input_map} if self.input_map != ("none",) else {}),
                **({"second_hidden": tuple(SAME if h is None else _hidden_text(h) for h in self.second_hidden)}
                   if self.second_hidden != (None,) else {}),
                **{f"{FINE_TUNING}{name}": tuple(values) for name, values in self.fine_tuning.items()}}  # fmt: skip

    def values_of(self, recipe: Recipe) -> dict:
        """The hyperparameter values of ``recipe`` (the inverse of :meth:`recipe`).

        Raises:
            TuningError: the recipe's method and options are no variant of this space.
        """
        variants = [v for v, (name, options) in self.methods.items() if (name, options) == (recipe.method, recipe.options)]
        if not variants:
            raise TuningError(f"recipe method {recipe.method!r} with options {recipe.options} is no variant of the search space")
        dropout = recipe.input_dropout
        first = float(next(iter(dropout.values()), 0.0)) if isinstance(dropout, dict) else float(dropout)
        towers = [recipe.hidden[m] for m in sorted(recipe.hidden)] if isinstance(recipe.hidden, dict) else [recipe.hidden] * 2
        second = SAME if towers[-1] == towers[0] else _hidden_text(towers[-1])
        return {"variant": variants[0], "hidden": _hidden_text(towers[0]), "dropout": recipe.dropout,
                "learning_rate": recipe.learning_rate, "weight_decay": recipe.weight_decay, "schedule": recipe.schedule,
                "epochs": recipe.epochs, "input_dropout": first,
                **({"input_map": recipe.input_map if isinstance(recipe.input_map, str) else next(iter(recipe.input_map.values()), "none")}
                   if "input_map" in self.choices() else {}),
                **({"second_hidden": second} if "second_hidden" in self.choices() else {}),
                **{f"{FINE_TUNING}{name}": getattr(recipe.spec().fine_tuning, name) for name in self.fine_tuning}}  # fmt: skip

    def recipe(self, values: dict, modalities: tuple[str, ...] = (), chosen: str = "") -> Recipe:
        """The :class:`tfhash.recipes.Recipe` of hyperparameter ``values`` (KerasTuner's own
        ``tuner/...`` entries are ignored). This is the one reading of a search's result: the
        library and the pipeline's Trainer both call it."""
        method, options = self.methods[values["variant"]]
        input_dropout = float(values.get("input_dropout", 0.0))
        hidden = _widths(values["hidden"])
        second = str(values.get("second_hidden", SAME))
        if second != SAME and len(modalities) == 2:
            hidden = {modalities[0]: hidden, modalities[1]: _widths(second)}
        return Recipe(method=method, options=dict(options), hidden=hidden,
                      dropout=float(values["dropout"]), learning_rate=float(values["learning_rate"]),
                      weight_decay=float(values["weight_decay"]), schedule=str(values["schedule"]), epochs=int(values["epochs"]),
                      input_dropout={modalities[0]: input_dropout} if modalities and input_dropout else input_dropout,
                      input_map=str(values.get("input_map", "none")), chosen=chosen,
                      fine_tuning={k[len(FINE_TUNING):]: v for k, v in values.items() if k.startswith(FINE_TUNING)})  # fmt: skip


def hyperparameters_of(choices: dict[str, tuple], defaults: dict):
    """``keras_tuner.HyperParameters`` of one choice per entry of ``choices`` (``{name: values}``),
    its default ``defaults[name]`` where the values hold it, else the first value.

    Raises:
        TuningError: an empty setting.
    """
    import keras_tuner

    hp = keras_tuner.HyperParameters()
    for name, values in choices.items():
        if not values:
            raise TuningError(f"the search space's {name!r} has no values")
        hp.Choice(name, list(values), default=defaults[name] if name in defaults and defaults[name] in values else values[0])
    return hp


def _recommended_variant(kind: str) -> dict[str, tuple[str, dict]]:
    recipe = RECOMMENDED[kind]
    # the method with the recommended recipe's options: a trial of it draws its other settings
    return {recipe.method + " (recommended options)": (recipe.method, dict(recipe.options))}


def _variants(*names: str) -> dict[str, tuple[str, dict]]:
    """The named methods and variants of :data:`tfhash.registry.VARIANTS`, in search order."""
    return {name: variant(name) for name in names}


_SINGLE_LABEL = _variants("scdh", "hclm", "shclm", "shclm triplet 1", "shclm triplet 2", "hyp2")
_MEAN_TEACHER = {f"mt-scdh {kind}": ("mt-scdh", dict(MEAN_TEACHER[kind]["options"])) for kind in MEAN_TEACHER}

#: What a search draws from, per kind of data (:data:`tfhash.recipes.DATA_KINDS`). Each holds the
#: kind's recommended recipe; the MT-SCDH variants of :data:`tfhash.recipes.MEAN_TEACHER` are
#: searched only when unlabelled rows are given.
SEARCH_SPACES: dict[str, SearchSpace] = {
    "single-label": SearchSpace(methods={**_recommended_variant("single-label"), **_SINGLE_LABEL, **_MEAN_TEACHER},
                                semi_supervised=tuple(_MEAN_TEACHER)),
    "single-label pixels": SearchSpace(methods={**_recommended_variant("single-label pixels"), **_SINGLE_LABEL, **_MEAN_TEACHER},
                                       semi_supervised=tuple(_MEAN_TEACHER)),
    "multi-label": SearchSpace(methods={**_recommended_variant("multi-label"),
                                        **_variants("hyp2 beta 4 labelled", "hyp2 beta 8 labelled", "hyp2", "scdh", "shclm", "hclm")}),
    "cross-modal": SearchSpace(methods={**_recommended_variant("cross-modal"), **_variants("jcch beta 0.1", "jcch fixed centres beta 0")},
                               epochs=(100, 200, 300), input_dropout=(0.0, 0.2), input_map=("none", "standardise", "rbf"),
                               second_hidden=(None, (1024,), (2048, 2048, 2048))),
}  # fmt: skip


def hyperband_schedule(max_units: int, factor: int, iterations: int = 1) -> list[tuple[int, int]]:
    """The rungs of Hyperband (Li et al., JMLR 2018, Algorithm 1) as ``(trials, units each)``, in
    the order and with the rounding of KerasTuner's ``HyperbandOracle`` (1.4), which runs the
    search: per iteration, brackets ``b = B-1 .. 0`` with ``B`` the number of divisions of
    ``max_units`` by ``factor`` that stay >= 1; bracket ``b``'s round ``r`` runs
    ``ceil(ceil(1 + log_factor(max_units)) / (b + 1) * factor^(b - r))`` trials of
    ``ceil(max_units / factor^(b - r))`` units (each bracket costs about the same)."""
    brackets, units = 0, float(max_units)
    while units >= 1:
        units, brackets = units / factor, brackets + 1
    last_size = math.ceil(1 + math.log(max_units, factor))
    rungs = []
    for _ in range(iterations):
        for b in reversed(range(brackets)):
            rungs += [(math.ceil(last_size / (b + 1) * factor ** (b - r)), math.ceil(max_units / factor ** (b - r))) for r in range(b + 1)]
    return rungs


@dataclass(frozen=True)
class Budget:
    """How much a search may spend.

    Args:
        max_units: Hyperband's top fidelity: a trial of ``u`` units trains ``u / max_units`` of its
            recipe's epochs (3 or more; each factor of ``factor`` adds a rung).
        factor: Hyperband's reduction factor (the share of trials promoted per rung is 1/factor).
        iterations: Hyperband iterations.
        trials: start no trial after this many (``None``: as Hyperband's schedule says).
        seconds: start no trial after this much wall time (``None``: no limit).

    Raises:
        TuningError: a budget that cannot run one trial.
    """

    max_units: int = 9
    factor: int = 3
    iterations: int = 1
    trials: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.max_units, int) and self.max_units >= self.factor >= 2 and self.iterations >= 1):
            raise TuningError(f"a budget needs max_units >= factor >= 2 and iterations >= 1; got max_units={self.max_units}, "
                              f"factor={self.factor}, iterations={self.iterations}")  # fmt: skip
        if self.trials is not None and self.trials < 1:
            raise TuningError(f"a budget of {self.trials} trials cannot run one trial; give trials >= 1 (or None)")
        if self.seconds is not None and not self.seconds > 0:
            raise TuningError(f"a budget of {self.seconds} seconds cannot run one trial; give seconds > 0 (or None)")

    @classmethod
    def of(cls, settings: dict) -> Budget:
        """The budget of a config's ``tuner`` section (its other keys, such as ``kind``, ignored)."""
        return cls(**{f.name: settings[f.name] for f in fields(cls) if f.name in settings})

    def schedule(self) -> list[tuple[int, int]]:
        """Hyperband's full schedule as ``(trials, units each)`` per rung (:func:`hyperband_schedule`)."""
        return hyperband_schedule(self.max_units, self.factor, self.iterations)

    def multiple(self) -> float:
        """The full schedule's training cost in trainings of one recipe (before ``trials`` and
        ``seconds`` cut it), the recommended recipe's full training included, not counting the final
        training on all rows."""
        return 1 + sum(n * units for n, units in self.schedule()) / self.max_units


@dataclass
class TuneResult:
    """What :func:`tune` chose and how.

    Attributes:
        recipe: the chosen :class:`tfhash.recipes.Recipe` (photos, a
            :class:`tfhash.tuning.photos.PhotoTuneResult`: the chosen
            :class:`tfhash.training_spec.TrainingSpec`); train it on all training rows with :meth:`fit`
            (at the same bits and seed).
        trials: one row per trial: ``trial``, the settings (``epochs``: the recipe's), ``units``,
            ``epochs trained``, ``score`` (validation mAP@all), ``mAP@1000`` (multi-label), each
            direction's mAP@all (cross-modal, e.g. ``image->text``), ``seconds``, ``status``
            (``ok`` / ``failed``), ``error``.
        score: the chosen trial's validation mAP@all.
        kind: the kind of data searched (a key of :data:`SEARCH_SPACES`).
        validation: how the validation split was carved.
        budget: the :class:`Budget`; ``seconds``: the search's wall time.
        unlabelled: the chosen recipe's trials trained on the unlabelled rows too (a
            :attr:`SearchSpace.semi_supervised` variant); :meth:`fit` then needs them.
        chosen: how the recipe was chosen (the search, its best score, whether the recommended
            recipe was kept).
    """

    recipe: Recipe | TrainingSpec
    trials: list[dict]
    score: float
    kind: str
    validation: str
    budget: Budget
    seconds: float
    seed: int = 0
    bits: int = 0
    unlabelled: bool = False
    chosen: str = ""

    def fit(self, x, labels, unlabelled=None, **kwargs):
        """Train :attr:`recipe` on all of ``x`` and ``labels`` at the searched bits and seed (and,
        when its trials trained on unlabelled rows too, on ``unlabelled``); ``kwargs`` as
        :meth:`tfhash.recipes.Recipe.fit` takes them.

        Raises:
            ValueError: unlabelled rows missing for a recipe trained with them, or given to one
                trained without (it would train differently from its trials).
        """
        labels = multi_hot(labels, kwargs.pop("num_classes", None))
        if self.unlabelled != (unlabelled is not None):
            raise ValueError("the chosen recipe's trials trained with unlabelled rows: pass them" if self.unlabelled else
                             f"the chosen recipe ({self.recipe.method}) trained on labelled rows only: drop unlabelled")
        x, labels = with_unlabelled(x, labels, None if unlabelled is None else np.asarray(unlabelled, dtype=np.float32))
        return self.recipe.fit(x, labels, self.bits, seed=self.seed, **kwargs)

    def table(self) -> str:
        """The trials as a markdown table."""
        scores = ["score", *sorted({name for row in self.trials for name in row if name == "mAP@1000" or "->" in name})]
        last = ["units", "epochs trained", *scores, "seconds", "status", "error"]
        columns = [c for c in dict.fromkeys(name for row in self.trials for name in row) if c not in last] + last
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for row in self.trials:
            cells = [row.get(c, "") for c in columns]
            lines.append("| " + " | ".join(f"{v:.4f}" if isinstance(v, float) and c in scores else str(v)
                                           for c, v in zip(columns, cells, strict=True)) + " |")  # fmt: skip
        return "\n".join(lines)

    def summary(self) -> dict:
        """A JSON-ready record: the recipe, the score, the cost and the trial table."""
        from dataclasses import asdict

        return {"recipe": asdict(self.recipe), "score": self.score, "kind": self.kind, "validation": self.validation,
                "budget": {**asdict(self.budget), "multiple": self.budget.multiple()}, "seconds": self.seconds,
                "seed": self.seed, "bits": self.bits, "unlabelled": self.unlabelled, "trials": self.trials}  # fmt: skip


def data_kind(x, labels: np.ndarray) -> str:
    """The kind of data (:data:`tfhash.recipes.DATA_KINDS`, or :data:`PHOTOS`) of inputs ``x`` and
    ``(n, C)`` labels: cross-modal for a dict of two modalities, multi-label when a row has several
    tags, photos for single-label images (``(n, H, W[, 3])``), otherwise single-label (features;
    pass ``kind="single-label pixels"`` to :func:`tune` for flattened raw pixels)."""
    if isinstance(x, dict):
        return "cross-modal"
    if bool((labels.sum(axis=1) > 1).any()):
        return "multi-label"
    return PHOTOS if are_photos(x) else "single-label"


def are_photos(x, kind: str | None = None) -> bool:
    """Whether :func:`tune` searches ``x`` as photos: ``kind`` says so, or (``kind`` None) ``x`` is
    one array of images ``(n, H, W[, C])`` rather than feature vectors or a dict of modalities."""
    return kind == PHOTOS or (kind is None and not isinstance(x, dict) and np.ndim(x) >= 3)


def carve_validation(labels: np.ndarray, seed: int, held_out: float = HELD_OUT, train_in_database: float = TRAIN_IN_DATABASE):
    """The validation split of :func:`tune` over ``(n, C)`` labelled rows
    (:func:`tfhash.data.splits.validation_split`): ``held_out`` of the rows leave training, of each
    class when the classes are of one size (single-label), at random otherwise (classes of uneven
    sizes then lose a share each in expectation, and training keeps every other row); half of them
    (a quarter, multi-label) are the queries, the rest the database, which training rows join to
    ``train_in_database`` of it.

    Raises:
        TuningError: too few rows (of a class) for a validation split.
    """
    from tfhash.data.splits import validation_split

    counts = labels.sum(axis=0)[labels.sum(axis=0) > 0]
    per_class = bool((labels.sum(axis=1) == 1).all()) and counts.min() == counts.max()
    if per_class:
        count = int(counts.min() * held_out)
        if count < MIN_HELD_OUT["single"]:
            need = math.ceil(MIN_HELD_OUT["single"] / held_out)
            raise TuningError(f"too few labelled rows for a validation split: {int(counts.min())} rows per class, a "
                              f"validation split needs at least {need} per class (held_out={held_out}); label more rows or "
                              "train a recommended recipe without tuning (tfhash.recipes.recommended)")  # fmt: skip
        queries = count // 2
    else:
        count = int(len(labels) * held_out)
        if count < MIN_HELD_OUT["multi"]:
            raise TuningError(f"too few labelled rows for a validation split: {len(labels)} rows, a validation split needs "
                              f"at least {math.ceil(MIN_HELD_OUT['multi'] / held_out)}; label more rows or train a "
                              "recommended recipe without tuning (tfhash.recipes.recommended)")  # fmt: skip
        queries = count // (4 if (labels.sum(axis=1) > 1).any() else 2)
    return validation_split(np.arange(len(labels)), labels, held_out=count, queries=queries, seed=seed,
                            train_in_database=train_in_database, at_random=not per_class)  # fmt: skip


@dataclass
class TuningTask:
    """What every trial of a search trains and scores on (:func:`prepare` makes it): the rows,
    their validation split, the kind of data, the code length, the seed, the space, the budget;
    the trials land in ``trials``."""

    x: object
    labels: np.ndarray
    split: object
    kind: str
    bits: int
    seed: int
    space: SearchSpace
    budget: Budget
    unlabelled: np.ndarray | None = None
    trials: list[dict] = field(default_factory=list)

    @property
    def modalities(self) -> tuple[str, ...]:
        return tuple(self.x) if isinstance(self.x, dict) else ()

    def rows(self, index):
        return {m: v[index] for m, v in self.x.items()} if isinstance(self.x, dict) else self.x[index]

    def training_rows(self, variant: str):
        """The trial's inputs and labels: the training part, plus the unlabelled rows (all-zero
        labels) for a semi-supervised variant (:attr:`SearchSpace.semi_supervised`)."""
        x, y = self.rows(self.split.train), self.labels[self.split.train]
        return with_unlabelled(x, y, self.unlabelled) if variant in self.space.semi_supervised else (x, y)

    def score(self, model) -> dict:
        """Validation mAP@all (cross-modal: the mean of both directions, each also recorded as
        ``"a->b"``); for multi-label data also ``mAP@1000``, the mAP of the top
        ``min(1000, validation database)`` items."""
        from tfhash.metrics import evaluate_retrieval

        q, db = self.split.query, self.split.database
        yq, ydb = self.labels[q], self.labels[db]
        if self.modalities:
            a, b = self.modalities
            first = evaluate_retrieval(model.encode(self.x[a][q], a), model.encode(self.x[b][db], b), yq, ydb)
            second = evaluate_retrieval(model.encode(self.x[b][q], b), model.encode(self.x[a][db], a), yq, ydb)
            directions = {f"{a}->{b}": first.mean_average_precision(), f"{b}->{a}": second.mean_average_precision()}
            return {OBJECTIVE: sum(directions.values()) / 2, **directions}
        codes_q, codes_db = model.encode(self.rows(q)), model.encode(self.rows(db))
        result = {OBJECTIVE: evaluate_retrieval(codes_q, codes_db, yq, ydb).mean_average_precision()}
        if (self.labels.sum(axis=1) > 1).any():
            depth = min(MAP_DEPTH, len(db))
            result["mAP@1000"] = evaluate_retrieval(codes_q, codes_db, yq, ydb, top_r=depth).mean_average_precision()
        return result

    def train(self, values: dict, epochs: int, callbacks: list):
        """The trained model of the trial of hyperparameter ``values``: its recipe over ``epochs``
        (its schedule spanning them) on the training part of the split."""
        x, y = self.training_rows(values["variant"])
        return self.space.recipe(values, self.modalities).fit(x, y, self.bits, seed=self.seed, num_classes=self.labels.shape[1],
                                                              epochs=epochs, callbacks=callbacks)  # fmt: skip

    def run(self, trial_id: str, values: dict) -> dict:
        """Train and score one trial; record it. Raises ``keras_tuner.errors.FailedTrialError`` on
        any failure (recorded with its message)."""
        import keras
        import keras_tuner

        units = int(values.get("tuner/epochs", self.budget.max_units))
        epochs = max(1, round(int(values["epochs"]) * units / self.budget.max_units))
        row = {"trial": trial_id, **{k: v for k, v in values.items() if not k.startswith("tuner/") and k != "kind"}, "units": units,
               "epochs trained": epochs}  # fmt: skip
        start = time.perf_counter()
        try:
            history = keras.callbacks.History()
            model = self.train(values, epochs, [keras.callbacks.TerminateOnNaN(), history])
            losses = np.asarray(history.history.get("loss", [np.nan]), dtype=float)
            if len(losses) < epochs or not np.isfinite(losses).all():
                raise FloatingPointError(f"the training loss was not finite (epoch {len(losses)} of {epochs}: {losses[-1]})")
            scores = self.score(model)
            if not all(np.isfinite(v) for v in scores.values()):
                raise FloatingPointError(f"the validation score was not finite: {scores}")
        except Exception as err:  # a failed trial is recorded and skipped, never the end of the search
            row.update(score=float("nan"), seconds=round(time.perf_counter() - start, 1), status="failed",
                       error=f"{type(err).__name__}: {err}"[:300])  # fmt: skip
            self.trials.append(row)
            raise keras_tuner.errors.FailedTrialError(row["error"]) from err
        finally:
            # Keras's names and graphs reset for the next trial; without a full garbage collection,
            # whose cost grows with everything the process holds (a second or more per trial in a
            # large process): the trial's objects are freed by Python's collector as usual.
            keras.backend.clear_session(free_memory=False)
        row.update(score=float(scores[OBJECTIVE]), seconds=round(time.perf_counter() - start, 1), status="ok", error="")
        row.update({name: float(value) for name, value in scores.items() if name != OBJECTIVE})
        self.trials.append(row)
        return {k: float(v) for k, v in scores.items()}


def tuned_recipe(values: dict, modalities: tuple[str, ...] = (), chosen: str = "") -> Recipe:
    """The recipe of a search's hyperparameter ``values`` over :data:`SEARCH_SPACES` (their
    ``kind`` names the space): how the pipeline's Trainer reads the Tuner's best hyperparameters."""
    return SEARCH_SPACES[values["kind"]].recipe(values, modalities, chosen)


def prepare(x, labels, bits: int, seed: int = 0, budget: Budget | None = None, *, kind: str | None = None,
            unlabelled=None, in_pipeline: bool = False, space: SearchSpace | None = None, num_classes: int | None = None,
            train_in_database: float = TRAIN_IN_DATABASE) -> tuple[TuningTask, Recipe | None]:  # fmt: skip
    """What a search runs on (:func:`tune`'s arguments, checked): ``(task, the space's default
    recipe)``, for :class:`tfhash.tuning.tuner.RecipeTuner`. ``in_pipeline``: only the recipes the TFX
    pipeline trains, of the kinds it tunes (:data:`tfhash.recipes.PIPELINE_KINDS`), as the
    pipeline's Tuner component asks."""
    from tfhash.codes import check_bits
    from tfhash.models.inputs import checked_features

    check_bits(bits)
    budget = Budget() if budget is None else budget
    check_training_rows(x, labels)
    labels = multi_hot(labels, num_classes)
    check_classes(labels)
    if isinstance(x, dict) and len(x) != 2:
        raise ValueError(f"x is a dict of {len(x)} modalities {sorted(x)}; paired items have two (one array otherwise)")
    checked_features(x if isinstance(x, dict) else {"features": x}, "x")
    if unlabelled is not None:
        if isinstance(x, dict):
            raise TuningError("unlabelled rows serve MT-SCDH on single-modality features; cross-modal data has no such method")
        unlabelled = checked_features({"unlabelled": unlabelled}, "unlabelled")["unlabelled"]
        if unlabelled.ndim != 2 or unlabelled.shape[1] != np.shape(x)[1]:
            raise ValueError(f"unlabelled rows must be (m, {np.shape(x)[1]}) like x; got {unlabelled.shape}")
    found = data_kind(x, labels)
    kind = found if kind is None else kind
    if kind not in SEARCH_SPACES:
        raise TuningError(f"unknown kind of data {kind!r}; choose one of {sorted([*SEARCH_SPACES, PHOTOS])}")
    if kind.split()[0] != found:  # "single-label pixels" is single-label data
        raise TuningError(f"kind {kind!r} does not fit these inputs and labels, which are {found} data")
    if in_pipeline and kind not in PIPELINE_KINDS:
        raise TuningError(f"the pipeline's Tuner searches the recipes of {PIPELINE_KINDS} (as training.recipe takes them); "
                          f"these are {kind} data: tune them with tfhash.tuning.tune or `tfhash tune`")  # fmt: skip
    space = (SEARCH_SPACES[kind] if space is None else space).restricted(in_pipeline, unlabelled is not None)
    if unlabelled is not None and not space.semi_supervised:
        raise TuningError(f"unlabelled rows were given, but no variant of the {kind} search space trains on them (its "
                          "semi_supervised variants); drop them, or search a space that names MT-SCDH variants there")  # fmt: skip
    recommended = RECOMMENDED.get(kind)
    default = recommended if recommended is not None and any(
        (recommended.method, recommended.options) == m for m in space.methods.values()) else None  # fmt: skip
    task = TuningTask(x=x, labels=labels, split=carve_validation(labels, seed, train_in_database=train_in_database), kind=kind, bits=bits, seed=seed, space=space,
                 budget=budget, unlabelled=unlabelled)  # fmt: skip
    return task, default
