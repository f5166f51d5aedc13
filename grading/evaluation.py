"""Evaluate predictions on a task set: SWE-bench's run reports, in parallel, resumable.

Writes ``DIR/<instance_id>/report.json`` (plus the applied patch and the test log beside it) for
each instance and ``DIR/report.json`` for the run, with SWE-bench's counts and id lists, and what
grading cost per instance (``cost``, :func:`patchgym.grading.cost.summarize`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchgym.grading.cost import summarize
from patchgym.grading.labels import settle
from patchgym.grading.parallel import run_parallel
from patchgym.grading.verifier import InstanceReport, Verifier
from patchgym.tasks.catalog import TaskSet
from patchgym.tasks.model import safe_name
from patchgym.tasks.predictions import Prediction

log = logging.getLogger(__name__)

REPORT_FILE = "report.json"
# What the evaluation in a directory graded (which predictions, with what), so that another one
# does not mix its results with it.
SETTINGS_FILE = "eval.json"
_INSTANCE_FILES = frozenset({REPORT_FILE, "patch.diff", "test_output.txt", f".{REPORT_FILE}.tmp"})


class EvalDirError(ValueError):
    """The output directory holds results of other predictions or settings (or of a run)."""


@dataclass
class RunSummary:
    """The run report: SWE-bench's fields (counts and ``*_ids``) plus patchgym's additions."""

    total_ids: list[str]
    submitted_ids: list[str] = field(default_factory=list)
    completed_ids: list[str] = field(default_factory=list)
    resolved_ids: list[str] = field(default_factory=list)
    unresolved_ids: list[str] = field(default_factory=list)
    empty_patch_ids: list[str] = field(default_factory=list)
    error_ids: list[str] = field(default_factory=list)
    resumed_ids: list[str] = field(default_factory=list)  # already reported by an earlier run
    # instance ids by how their grading ended (grading.labels)
    outcome_ids: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    cost: dict[str, Any] | None = None  # per instance graded: grading.cost.summarize

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("total", "submitted", "completed", "resolved", "unresolved", "empty_patch", "error"):
            ids = getattr(self, f"{name}_ids")
            out[f"{name}_instances"] = len(ids)
        for name in ("total", "submitted", "completed", "resolved", "unresolved", "empty_patch", "error"):
            out[f"{name}_ids"] = sorted(getattr(self, f"{name}_ids"))
        out["resumed_ids"] = sorted(self.resumed_ids)
        out["outcome_ids"] = {label: sorted(ids) for label, ids in sorted(self.outcome_ids.items())}
        out["schema_version"] = 2
        out["seconds"] = round(self.seconds, 2)
        out["cost"] = self.cost
        return out


def instance_dir(output: Path, instance_id: str) -> Path:
    return output / safe_name(instance_id)


def write_instance(output: Path, report: InstanceReport, patch: str | None) -> None:
    """Write one instance's report, patch and test log (report last, so resume sees whole ones)."""
    d = instance_dir(output, report.instance_id)
    d.mkdir(parents=True, exist_ok=True)
    (d / "patch.diff").write_text(patch or "", encoding="utf-8")
    (d / "test_output.txt").write_text(report.test_output, encoding="utf-8")
    tmp = d / f".{REPORT_FILE}.tmp"
    tmp.write_text(json.dumps({report.instance_id: report.swebench_dict()}, indent=2), encoding="utf-8")
    os.replace(tmp, d / REPORT_FILE)


def read_instance(output: Path, instance_id: str, patch: str | None) -> InstanceReport | None:
    """The report an earlier run wrote for this instance, if it graded this same patch."""
    d = instance_dir(output, instance_id)
    try:
        if (d / "patch.diff").read_text(encoding="utf-8") != (patch or ""):
            return None  # the prediction changed since: grade it again
        data = json.loads((d / REPORT_FILE).read_text(encoding="utf-8"))
        return InstanceReport.model_validate(data[instance_id])
    except (OSError, ValueError, KeyError):
        return None


def claim_output(output: Path, settings: dict[str, Any], *, replace: bool = False) -> None:
    """Make ``output`` the directory of the evaluation ``settings`` describe (which predictions,
    graded how): one that holds results of other settings is refused, as ``patchgym run`` refuses
    a run directory of other settings, since resuming there would mix two evaluations in one
    report and leave the other's instances on disk; with ``replace`` those results are removed
    first (only what an evaluation writes: its reports and instance directories)."""
    found = _read_settings(output)
    if found is not None and not replace:
        differs = {k: (found.get(k), settings.get(k)) for k in sorted(set(found) | set(settings))
                   if found.get(k) != settings.get(k)}
        if differs:
            raise EvalDirError(f"{output} holds an evaluation with other settings ({differs}); use another "
                               f"--output, or --force to replace it")
    elif (output / "run.json").exists() and not replace:
        raise EvalDirError(f"{output} holds a patchgym run (run.json), not an evaluation; use another --output")
    elif (output / REPORT_FILE).exists() and not replace:
        raise EvalDirError(f"{output} holds an evaluation that did not record its settings; use another "
                           f"--output, or --force to replace it")
    if replace:
        _remove_results(output)
    output.mkdir(parents=True, exist_ok=True)
    _write_atomically(output / SETTINGS_FILE, json.dumps(settings, indent=2) + "\n")


def _read_settings(output: Path) -> dict[str, Any] | None:
    try:
        value = json.loads((output / SETTINGS_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"unreadable": str(output / SETTINGS_FILE)}
    return value if isinstance(value, dict) else {"unreadable": str(output / SETTINGS_FILE)}


def _remove_results(output: Path) -> None:
    """Remove an evaluation's files from ``output``: its reports and its instance directories
    (subdirectories holding only what :func:`write_instance` writes), nothing else."""
    if not output.is_dir():
        return
    for path in output.iterdir():
        if path.is_dir() and not path.is_symlink():
            names = {p.name for p in path.iterdir()}
            if names and names <= _INSTANCE_FILES:
                shutil.rmtree(path)
    for name in (REPORT_FILE, SETTINGS_FILE):
        (output / name).unlink(missing_ok=True)


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # whole or absent, however the run ends
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def evaluate(
    tasks: TaskSet,
    predictions: dict[str, Prediction],
    output: Path,
    *,
    verifier: Verifier,
    workers: int = 1,
    force: bool = False,
    on_done: Callable[[InstanceReport, bool], None] | None = None,
) -> RunSummary:
    """Grade every prediction; ``on_done(report, resumed)`` is called as each instance finishes.
    Instances whose report is in ``output`` for the same patch are not graded again, unless
    ``force`` (:func:`claim_output` first keeps another evaluation's results out of ``output``)."""
    started = time.monotonic()
    output.mkdir(parents=True, exist_ok=True)
    summary = RunSummary(total_ids=tasks.ids)
    reports: dict[str, InstanceReport] = {}
    todo: list[str] = []
    for task in tasks:
        pred = predictions.get(task.instance_id)
        if pred is None:
            continue
        summary.submitted_ids.append(task.instance_id)
        previous = None if force else read_instance(output, task.instance_id, pred.model_patch)
        if previous is not None and not previous.infrastructure_failure:
            reports[task.instance_id] = previous
            summary.resumed_ids.append(task.instance_id)
            if on_done:
                on_done(previous, True)
        else:
            todo.append(task.instance_id)

    def run_one(instance_id: str) -> InstanceReport:
        pred = predictions[instance_id]
        task = tasks.get(instance_id)
        try:
            report = verifier.verify(task, pred.model_patch, model_name=pred.model_name_or_path)
        except Exception as exc:  # a harness bug must not take the whole run down, nor be masked unproven
            report = verifier.settle_crash(task, pred.model_patch, exc, model_name=pred.model_name_or_path)
        write_instance(output, report, pred.model_patch)
        return report

    def finished(report: InstanceReport) -> None:
        reports[report.instance_id] = report
        if on_done:
            on_done(report, False)

    run_parallel(run_one, todo, workers, finished)

    for instance_id in summary.submitted_ids:
        report = settle(reports[instance_id])
        summary.outcome_ids.setdefault(str(report.outcome), []).append(instance_id)
        if report.infrastructure_failure:
            summary.error_ids.append(instance_id)
            continue
        if not report.patch_exists:
            summary.empty_patch_ids.append(instance_id)
            continue
        summary.completed_ids.append(instance_id)
        (summary.resolved_ids if report.resolved else summary.unresolved_ids).append(instance_id)
    summary.seconds = time.monotonic() - started
    summary.cost = summarize([reports[i].cost for i in summary.submitted_ids if reports[i].cost is not None],
                             verifier.prices)
    _write_atomically(output / REPORT_FILE, json.dumps(summary.to_dict(), indent=2) + "\n")
    return summary
