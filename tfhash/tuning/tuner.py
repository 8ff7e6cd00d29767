"""The KerasTuner classes of :mod:`tfhash.tuning`'s search: :class:`RecipeOracle` (Hyperband that
trains the recommended recipe first and keeps it unless beaten) and :class:`RecipeTuner` (a trial
trains and scores one recipe). :func:`tfhash.tuning.tune` runs them; the TFX pipeline's stock
``Tuner`` component runs the same tuner. Importing this module imports KerasTuner (the tuning
extra)."""

from __future__ import annotations

import logging
import time

import keras_tuner

from tfhash.recipes import Recipe
from tfhash.tuning.search import (
    KEEP_RECOMMENDED_WITHIN,
    OBJECTIVE,
    Budget,
    TuningError,
    TuningTask,
    beats,
)

__all__ = ["RecipeTuner", "RecipeOracle"]


class RecipeOracle(keras_tuner.oracles.HyperbandOracle):
    """Hyperband whose first trial trains the space's defaults (the recommended recipe) at full
    fidelity, which stops starting trials when the :class:`~tfhash.tuning.Budget`'s trials or
    seconds are spent, and whose best trial is the best at the highest fidelity reached, the
    recommended recipe kept unless beaten by ``margin`` (:func:`~tfhash.tuning.beats`)."""

    def __init__(self, budget: Budget, hyperparameters, seed: int, has_default: bool, margin: float):
        super().__init__(objective=keras_tuner.Objective(OBJECTIVE, direction="max"), max_epochs=budget.max_units,
                         factor=budget.factor, hyperband_iterations=budget.iterations,
                         seed=seed + 1,  # KerasTuner draws a random seed for a falsy one: 0 must stay a seed
                         hyperparameters=hyperparameters, max_consecutive_failed_trials=10**9)  # fmt: skip
        self.budget, self.started, self.margin = budget, time.monotonic(), margin
        self.default_pending, self.default_trial, self.kept_default = has_default, None, False

    def populate_space(self, trial_id):
        spent = self.budget.seconds is not None and time.monotonic() - self.started >= self.budget.seconds
        if spent or (self.budget.trials is not None and len(self.trials) >= self.budget.trials):
            return {"status": "STOPPED", "values": None}
        if self.default_pending:  # the recommended recipe, at full fidelity, outside Hyperband's brackets
            self.default_pending, self.default_trial = False, trial_id
            values = {hp.name: hp.default for hp in self.hyperparameters.space}
            return {"status": "RUNNING", "values": {**values, "tuner/epochs": self.max_epochs, "tuner/initial_epoch": 0,
                                                    "tuner/bracket": 0, "tuner/round": 0}}  # fmt: skip
        return super().populate_space(trial_id)

    def get_best_trials(self, num_trials=1):
        """The best completed trials, highest fidelity first, then by score; the recommended
        recipe first unless a trial of the same fidelity beats it (then the best such trial first;
        ``num_trials=None``: every completed trial, as the TFX Tuner's ``tuner_results`` asks)."""
        done = [t for t in self.trials.values() if t.status == "COMPLETED" and t.score is not None]
        done.sort(key=lambda t: (t.hyperparameters.values.get("tuner/epochs", 0), t.score), reverse=True)
        default = self.trials.get(self.default_trial)
        if done and default in done and done[0] is not default:
            units = default.hyperparameters.values["tuner/epochs"]
            rivals = [t for t in done if t is not default and t.hyperparameters.values["tuner/epochs"] == units]
            winners = [t for t in rivals if beats(_last_metrics(t), _last_metrics(default), self.margin)]
            first = winners[0] if winners else default
            done.remove(first)
            done.insert(0, first)
            self.kept_default = first is default
        return done[:num_trials]


class RecipeTuner(keras_tuner.Tuner):
    """Searches ``task.space`` under ``task.budget`` (:func:`tfhash.tuning.prepare` makes the task;
    ``search()`` takes no arguments and the trials land in ``task.trials``): each trial trains
    :meth:`~tfhash.tuning.SearchSpace.recipe` of its values and scores it on the validation split.
    The first trial trains ``default`` at full fidelity, kept unless beaten by ``margin``. A search
    starts afresh in ``directory`` (no resuming: the trial table lives in ``task``).

    Raises:
        TuningError: a negative ``margin`` (it would let a worse recipe win); from ``search()``,
            every trial failing.
    """

    def __init__(self, task: TuningTask, default: Recipe | None, directory: str, project: str = "tfhash_tuning",
                 margin: float = KEEP_RECOMMENDED_WITHIN):  # fmt: skip
        if not margin >= 0:
            raise TuningError(f"margin must be >= 0 (the validation gain a trial needs over the recommended recipe); got {margin}")
        hp = task.space.hyperparameters(default)
        hp.Fixed("kind", task.kind)  # names the space, so that the values alone give the recipe (tuned_recipe)
        oracle = RecipeOracle(task.budget, hp, task.seed, default is not None, margin)
        self.task = task
        super().__init__(oracle, directory=directory, project_name=project, overwrite=True)

    def run_trial(self, trial, *args, **kwargs):
        # every trial's new model retraces Keras's predict function by design: TensorFlow's warning
        # about it says nothing to act on, and is held back while the trial runs
        tensorflow_log = logging.getLogger("tensorflow")
        tensorflow_log.addFilter(_not_retracing)
        try:
            return self.task.run(trial.trial_id, trial.hyperparameters.values)
        finally:
            tensorflow_log.removeFilter(_not_retracing)

    def on_search_end(self):
        super().on_search_end()
        if not self.oracle.get_best_trials(1):
            failed = [t for t in self.task.trials if t["status"] == "failed"]
            first = failed[0]["error"] if failed else "no trial ran"
            raise TuningError(f"all {len(self.task.trials)} trials failed; the first: {first}")


def _not_retracing(record: logging.LogRecord) -> bool:
    """A logging filter: every record but TensorFlow's warnings of ``tf.function`` retracing."""
    return "triggered tf.function retracing" not in record.getMessage()


def _last_metrics(trial) -> dict[str, float]:
    """A completed KerasTuner trial's last value of each metric it reported (:meth:`TuningTask.score`)."""
    return {name: trial.metrics.get_last_value(name) for name in trial.metrics.metrics}
