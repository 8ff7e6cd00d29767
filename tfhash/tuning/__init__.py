"""Model selection on the user's own data: the method and recipe chosen on a validation split carved
from the training rows, never on the queries.

:func:`tune` picks a :class:`tfhash.recipes.Recipe` for feature vectors and their labels. The search is
KerasTuner's Hyperband (:class:`tfhash.tuning.tuner.RecipeTuner`, also importable from here), so the same
tuner runs inside the TFX pipeline's stock ``Tuner`` component. It starts from tfhash's recommended recipe
and leaves it only for a gain larger than validation noise.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import replace

from tfhash.labels import multi_hot
from tfhash.recipes import recommended_photos
from tfhash.training_spec import PHOTOS, TrainingSpec
from tfhash.tuning.photos import PhotoSpace, PhotoTuneResult, prepare_photos
from tfhash.tuning.search import (
    HELD_OUT,
    KEEP_RECOMMENDED_WITHIN,
    OBJECTIVE,
    SEARCH_SPACES,
    TRAIN_IN_DATABASE,
    Budget,
    SearchSpace,
    TuneResult,
    TuningError,
    TuningTask,
    are_photos,
    beats,
    carve_validation,
    data_kind,
    prepare,
    tuned_recipe,
)

__all__ = ["tune", "TuneResult", "Budget", "SearchSpace", "TuningError", "TuningTask", "prepare", "data_kind", "carve_validation",
           "beats", "tuned_recipe", "SEARCH_SPACES", "KEEP_RECOMMENDED_WITHIN", "OBJECTIVE", "PhotoSpace",
           "TRAIN_IN_DATABASE", "HELD_OUT"]


def tune(x, labels, bits: int, seed: int = 0, budget: Budget | None = None, *, kind: str | None = None,
         unlabelled=None, space: SearchSpace | PhotoSpace | None = None, directory: str | None = None,
         num_classes: int | None = None, margin: float = KEEP_RECOMMENDED_WITHIN, train_in_database: float = TRAIN_IN_DATABASE,
         base: TrainingSpec | None = None, data_root=None, verbose: int = 0) -> TuneResult:  # fmt: skip
    """Choose the method and recipe for ``x`` and ``labels`` on a validation split of these rows.

    For example::

        result = tfhash.tuning.tune(features, class_ids, bits=32, seed=0)
        model = result.fit(features, class_ids)      # all training rows: result.recipe.fit
        print(result.table())                        # every trial, its score and time

    What it searches is declared once, in :data:`SEARCH_SPACES` (one :class:`SearchSpace` per kind
    of data of :data:`tfhash.recipes.DATA_KINDS`): the registered methods that fit the labels, with
    their own settings, and the recipe's settings (MLP width, dropout, learning rate and schedule,
    weight decay, epochs). Every space holds the recommended recipe of its kind
    (:data:`tfhash.recipes.RECOMMENDED`).

    Hyperband's "epochs" are units of a budget (:attr:`Budget.max_units`); a trial trains
    its share of the recipe's epochs from scratch, with the learning-rate schedule spanning those
    epochs. Only trials at the highest fidelity reached can be chosen (a short run's score is not
    comparable with a full one's).

    A trial scores mAP@all of held-out training rows against held-out training rows plus a share of
    the rows trained on (:data:`TRAIN_IN_DATABASE`, the catalogue containing what was trained on), the
    last epoch; multi-label data also records mAP@1000 (the top min(1000, validation database)
    items); cross-modal data scores the mean of the two directions.

    A trial that raises, or whose loss or score is not finite, is recorded in the trial table with
    its error and skipped.

    Photos (uint8 pixels ``(n, H, W[, 3])``, kind ``"single-label photos"``) search the settings
    that train above one pretrained network's cut (:class:`tfhash.tuning.photos.PhotoSpace`), every
    trial on one trunk cache the first trial builds; the result's ``recipe`` is then a
    :class:`tfhash.training_spec.TrainingSpec` (``base`` with the chosen settings).

    Args:
        x: ``(n, d)`` feature vectors, ``{modality: (n, d_m)}`` for paired items of two
            modalities, or photos.
        labels: class ids ``(n,)`` or one-hot / multi-hot ``(n, C)``.
        bits: the code length K.
        seed: seeds the validation split, the search and every trial's initial weights.
        budget: a :class:`Budget` (default ``Budget()``: about ten trainings' worth; photos
            :data:`tfhash.tuning.photos.PHOTO_BUDGET`, five).
        kind: the kind of data (:data:`tfhash.recipes.DATA_KINDS`; default from ``x`` and
            ``labels``, :func:`data_kind`).
        unlabelled: ``(m, d)`` rows without labels: the space's semi-supervised variants (MT-SCDH
            with :data:`tfhash.recipes.MEAN_TEACHER`) join the search, the only ones training on
            them too.
        space: a :class:`SearchSpace` (default ``SEARCH_SPACES[kind]``); photos a
            :class:`PhotoSpace` (default ``PhotoSpace()``), with ``base``'s own value of each
            setting added where it lacks it (:meth:`PhotoSpace.around`).
        directory: where KerasTuner writes its state, kept for inspection (default a temporary
            folder, removed after); a search starts afresh there.
        num_classes: C, when ids do not reach the last class.
        margin: the recommended recipe (trained first, at full fidelity) is kept unless another
            trial beats its validation score by this much without losing any of its other scores
            (each direction, mAP@1000) by more (:func:`beats`; 0: any gain that loses nothing).
        train_in_database: the share of the validation database drawn from the rows trained on:
            set your catalogue's (a database of the training items themselves, as Wiki's, near
            0.9; unseen items mostly, as CIFAR-10's protocol, 0.08); :data:`TRAIN_IN_DATABASE`
            when unknown. Recipes that fit the training rows closely rank them well, so the share
            changes which recipe wins.
        base: photos: the spec the search starts from and keeps but for the searched settings (the
            network, its side and cut, the views, the precision; default
            :func:`tfhash.recipes.recommended_photos` at ``bits`` and ``seed``); its trunk cache is
            kept in ``directory`` unless it names its own. Other data refuse it.
        data_root: photos: where the network's local ImageNet weights are looked for.

    Returns:
        :class:`TuneResult`; its ``recipe`` is trained on all rows with ``recipe.fit``.

    Raises:
        TuningError: an empty search space, a budget that cannot run one trial, too few labelled
            rows for a validation split, every trial failing, ``base`` for data that are not photos.
        ValueError: bad labels, inputs or bits (as :meth:`tfhash.recipes.Recipe.fit` says).
    """
    from tfhash.tuning.tuner import RecipeTuner

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfhash-tune-") as scratch:
        if are_photos(x, kind):
            if unlabelled is not None:
                raise TuningError(f"{PHOTOS!r} train on labelled images only; drop unlabelled")
            base = recommended_photos(bits, seed) if base is None else replace(base, bits=bits, seed=seed)
            task, default = prepare_photos(x, multi_hot(labels, num_classes), base, budget, space=space,
                                           cache_dir=os.path.join(directory or scratch, "trunk_cache"),
                                           train_in_database=train_in_database, data_root=data_root)  # fmt: skip
        else:
            if base is not None:
                raise TuningError("base is the spec photos are searched above; these inputs are not photos (uint8 pixels "
                                  "(n, H, W[, 3])): drop base, or pass the images")  # fmt: skip
            task, default = prepare(x, labels, bits, seed, budget, kind=kind, unlabelled=unlabelled, space=space, num_classes=num_classes,
                                    train_in_database=train_in_database)  # fmt: skip
        tuner = RecipeTuner(task, default, directory or scratch, margin=margin)
        tuner.search(verbose=verbose)
        best = tuner.oracle.get_best_trials(1)[0]
    values, score = best.hyperparameters.values, float(best.score)
    ok = sum(t["status"] == "ok" for t in task.trials)
    top = values.get("tuner/epochs", task.budget.max_units)
    rivals = [t for t in task.trials if t["status"] == "ok" and t["units"] == top and t["trial"] != best.trial_id]
    chosen = (f"tfhash.tuning.tune({task.kind}, {bits} bits, seed {seed}): validation mAP@all {score:.4f}, best of {ok} "
              f"completed trials ({len(task.trials) - ok} failed)"
              + (f"; the recommended recipe kept (no other trial beat it by {margin} without losing a score by more)"
                 if tuner.oracle.kept_default else "")
              + ("" if rivals else "; no other trial reached full fidelity: a larger budget compares more")
              + f"; {task.split.protocol}")  # fmt: skip
    if task.kind == PHOTOS:
        recipe = task.space.spec(values, task.base)
        recipe = replace(recipe, fine_tuning=replace(recipe.fine_tuning, trunk_cache=replace(recipe.fine_tuning.trunk_cache,
                                                                                              directory=base.fine_tuning.trunk_cache.directory)))
    else:
        recipe = task.space.recipe(values, task.modalities, chosen=chosen)
    return (PhotoTuneResult if task.kind == PHOTOS else TuneResult)(recipe=recipe, trials=task.trials, score=score, kind=task.kind, validation=task.split.protocol, budget=task.budget,
                      seconds=round(time.perf_counter() - start, 1), seed=seed, bits=bits, chosen=chosen,
                      unlabelled=values["variant"] in getattr(task.space, "semi_supervised", ()))  # fmt: skip


def __getattr__(name: str):
    if name == "RecipeTuner":  # KerasTuner (the tuning extra) is imported only when it is asked for
        from tfhash.tuning.tuner import RecipeTuner

        return RecipeTuner
    raise AttributeError(f"module 'tfhash.tuning' has no attribute {name!r}")
