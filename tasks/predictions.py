"""Predictions in SWE-bench's format: ``{instance_id, model_name_or_path, model_patch}`` rows."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from patchgym.tasks.catalog import TaskSet
from patchgym.tasks.model import TaskFileError, read_models

GOLD = "gold"
EMPTY = "empty"


class Prediction(BaseModel):
    model_config = ConfigDict(extra="allow")

    instance_id: str = Field(min_length=1)
    model_name_or_path: str = "unknown"
    model_patch: str | None = None


def load_predictions(source: str, tasks: TaskSet) -> dict[str, Prediction]:
    """Predictions keyed by instance id, from a file or the built-ins ``gold`` and ``empty``.

    ``gold`` takes each task's own fix; ``empty`` submits no change. A prediction for an instance
    the task set does not have is an error, as is the same instance predicted twice.
    """
    if source == GOLD:
        return {t.instance_id: Prediction(instance_id=t.instance_id, model_name_or_path=GOLD,
                                          model_patch=t.patch) for t in tasks}
    if source == EMPTY:
        return {t.instance_id: Prediction(instance_id=t.instance_id, model_name_or_path=EMPTY,
                                          model_patch="") for t in tasks}
    path = Path(source).expanduser()
    if not path.is_file():
        raise TaskFileError(f"{path}: no such predictions file (or use 'gold' or 'empty')")
    out: dict[str, Prediction] = {}
    for where, pred in read_models(path, Prediction):
        if pred.instance_id not in tasks:
            raise TaskFileError(f"{path}:{where}: unknown instance id {pred.instance_id!r} "
                                f"(not in {tasks.origin or 'the task set'})")
        out[pred.instance_id] = pred
    return out

