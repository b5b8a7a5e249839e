"""Tune's hooks of a sweep's runner: a Callback that turns Tune's trial events
into sweep events (engine.sweep.events) and a Stopper that carries out the
stop commands the runner reads. Both are pickled with Tune's experiment state
(for --resume) holding nothing: they find this process's sink and commands
in engine.sweep.runner when called.
"""
from __future__ import annotations

from pathlib import Path

from ray import tune
from ray.tune.stopper import Stopper

from . import runner
from .events import TrialStatus
from .trial import CHECKPOINT_FILE, TrialFailed


class EventCallback(tune.Callback):
    """Tune's trial events as sweep events (SINK: this process's sink)."""

    def __getstate__(self):  # pickled with the experiment: nothing of this process goes along
        return {}

    def __setstate__(self, state):
        pass

    def on_trial_start(self, iteration, trials, trial, **info):
        runner.SINK.emit({"event": "trial_started", "trial": trial.trial_id,
                          "settings": {**runner.SINK.run_fields, **trial.config}})

    def on_trial_result(self, iteration, trials, trial, result, **info):
        event = {"event": "trial_result", "trial": trial.trial_id}
        for key in ("step", "num_steps", "names_seen", "train_seconds", "first_step", "losses", "block",
                    "heldout", "heldout_loss", "train_loss", "node", "eval_seconds"):
            if key in result:
                event[key] = result[key]
        event["wall_seconds"] = result.get("time_total_s")
        if result.get("checkpoint_dir_name"):
            event["checkpoint"] = checkpoint_file(trial.path, result["checkpoint_dir_name"])
        runner.SINK.emit(event)

    def on_trial_complete(self, iteration, trials, trial, **info):
        result = trial.last_result or {}
        if result.get("diverged"):
            status = TrialStatus.DIVERGED
        elif result.get("finished"):
            status = TrialStatus.DONE
        elif trial.trial_id in runner.COMMANDS.cut:
            status = TrialStatus.STOPPED_EARLY
        else:
            status = TrialStatus.STOPPED
        message = "the loss became NaN or inf: lower the learning rate" if status == TrialStatus.DIVERGED else ""
        runner.SINK.emit({"event": "trial_ended", "trial": trial.trial_id, "status": status.value,
                          "message": message, "checkpoint": latest_checkpoint(trial)})

    def on_trial_error(self, iteration, trials, trial, **info):
        runner.SINK.emit({"event": "trial_ended", "trial": trial.trial_id, "status": TrialStatus.FAILED.value,
                          "message": trial_error_message(trial), "checkpoint": latest_checkpoint(trial)})

    def on_experiment_end(self, trials, **info):
        for trial in trials:  # trials the sweep's end stopped (Stop, the time budget)
            record = runner.SINK.table.trials.get(trial.trial_id)
            if record is not None and not record.status.ended:
                runner.SINK.emit({"event": "trial_ended", "trial": trial.trial_id,
                                  "status": TrialStatus.STOPPED.value, "message": "",
                                  "checkpoint": latest_checkpoint(trial)})


class CommandStopper(Stopper):
    """One trial's stop, asked on stdin (runner.COMMANDS). Stopping the whole sweep goes
    through Tune's interrupt instead (runner.Commands.request_stop), which keeps it resumable."""

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        pass

    def __call__(self, trial_id, result):
        return trial_id in runner.COMMANDS.stop_trials

    def stop_all(self):
        return False


def checkpoint_file(trial_path: str, checkpoint_dir: str) -> str:
    return str(Path(trial_path) / checkpoint_dir / CHECKPOINT_FILE)


def latest_checkpoint(trial) -> str | None:
    """The trial's newest checkpoint file: Tune's, or the newest a result reported (a trial
    stopped just after reporting one is ended before Tune has registered it)."""
    checkpoint = trial.checkpoint
    if checkpoint is not None:
        return str(Path(checkpoint.path) / CHECKPOINT_FILE)
    record = runner.SINK.table.trials.get(trial.trial_id)
    return record.checkpoint if record is not None else None


def trial_error_message(trial) -> str:
    """The one line that says why a trial failed (a TrialFailed's own message), from the
    error Tune just wrote beside the trial (its driver-side copy: storage syncs later)."""
    error = None
    try:
        if trial.pickled_error_file and Path(trial.pickled_error_file).exists():
            import cloudpickle

            with open(trial.pickled_error_file, "rb") as f:
                error = cloudpickle.load(f)
    except Exception:
        error = None
    cause = getattr(error, "cause", None) or error
    if cause is not None:
        text = str(cause).strip().splitlines()
        if isinstance(cause, TrialFailed) and text:
            return text[0]
        name = type(cause).__name__
        if "Unable to set up cluster storage" in str(cause):
            return ("the trial's node cannot write the sweep's folder: on a cluster, give --dir on a "
                    "filesystem every node mounts (NFS)")
        if "ActorDied" in name or "actor died" in " ".join(text).lower():
            return "the trial's process died (out of memory, or killed)"
        return f"{name}: {text[-1] if text else ''}".rstrip(": ")
    try:
        text = Path(trial.error_file).read_text().strip().splitlines() if trial.error_file else []
    except OSError:
        text = []
    return text[-1] if text else "the trial failed"
