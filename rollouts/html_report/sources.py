"""What a report page shows, read from a directory of ``patchgym run`` or of ``patchgym eval``, in
one shape: the run report's (``report.json`` of a run: counts, a rate with its interval, a row per
task), the run's settings, and per task its trajectory (a run's) or its patch and grading (an
evaluation's). Every file but the directory's ``report.json`` may be missing or partial."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchgym.grading.evaluation import REPORT_FILE, SETTINGS_FILE, instance_dir
from patchgym.rollouts.html_report.charts import repo_of
from patchgym.rollouts.html_report.reading import RunReportMissing, read_json, read_jsonl
from patchgym.rollouts.stats import wilson

WHAT_IT_TAKES = "patchgym report takes the directory of a `patchgym run` or of a `patchgym eval` (its --output)"


@dataclass
class Source:
    """A directory read for its page. ``kind``: ``run`` or ``eval``; ``report``: in the run
    report's shape; ``run``: the settings (run.json, or an evaluation's eval.json as ``params``);
    ``trajectories``: a line per task (an evaluation's: its patch and grading report, no
    messages), None when the run has none yet."""

    kind: str
    directory: Path
    report: dict[str, Any]
    run: dict[str, Any] | None
    trajectories: list[dict[str, Any]] | None
    predictions: list[dict[str, Any]] | None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.report.get("model") or (self.run or {}).get("model") or self.directory.name or "?")

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [r for r in (self.report.get("instances") or []) if isinstance(r, dict)]


def read_source(directory: Path) -> Source:
    """The run or evaluation in ``directory``. Raises :class:`RunReportMissing` (saying what the
    command takes) when it has no ``report.json``, ``ValueError`` when that is not a report."""
    directory = Path(directory)
    notes: list[str] = []
    if not (directory / REPORT_FILE).is_file():
        where = "no such directory" if not directory.is_dir() else f"no {REPORT_FILE} here"
        raise RunReportMissing(f"{directory}: {where} ({WHAT_IT_TAKES}, once it has written its report)")
    report = read_json(directory / REPORT_FILE, notes, required=True)
    if not isinstance(report, dict):
        raise ValueError(f"{directory / REPORT_FILE}: not a JSON object")
    if "total_instances" in report or (directory / SETTINGS_FILE).is_file():
        return _evaluation(directory, report, notes)
    if "instances" not in report and "resolved" not in report:
        raise ValueError(f"{directory / REPORT_FILE}: neither a run's report nor an evaluation's ({WHAT_IT_TAKES})")
    run = read_json(directory / "run.json", notes)
    trajectories = read_jsonl(directory / "trajectories.jsonl", notes)
    if trajectories is None:
        notes.append("trajectories.jsonl is missing (no episode finished yet?): no trajectories to show.")
    predictions = read_jsonl(directory / "predictions.jsonl", notes)
    if predictions is None:
        notes.append("predictions.jsonl is missing.")
    if not isinstance(report.get("instances"), list):
        notes.append("report.json has no instances list: no per-task rows.")
    return Source("run", directory, report, run if isinstance(run, dict) else None, trajectories, predictions, notes)


def _evaluation(directory: Path, summary: dict[str, Any], notes: list[str]) -> Source:
    """An evaluation's directory as a run: a row per graded instance from its own report.json,
    its patch.diff as the prediction; instances whose grading failed are the masked ones."""
    settings = read_json(directory / SETTINGS_FILE, notes)
    settings = settings if isinstance(settings, dict) else {}
    ids = [str(i) for i in summary.get("submitted_ids") or summary.get("total_ids") or []]
    errors = {str(i) for i in summary.get("error_ids") or []}
    rows, lines, models = [], [], []
    for iid in ids:
        d = instance_dir(directory, iid)
        found = read_json(d / REPORT_FILE, notes) if (d / REPORT_FILE).is_file() else None
        graded = found.get(iid) if isinstance(found, dict) and isinstance(found.get(iid), dict) else None
        if graded is None:
            notes.append(f"{iid}: no readable {d.name}/{REPORT_FILE}.")
            rows.append({"instance_id": iid, "repo": repo_of({"instance_id": iid}), "outcome": None})
            continue
        masked = iid in errors or bool(graded.get("infrastructure_failure"))
        outcome = "masked" if masked else "resolved" if graded.get("resolved") else "unresolved"
        reason = graded.get("infrastructure_failure_reason") if masked else None
        how = graded.get("outcome") or ("empty_patch" if not graded.get("patch_exists") else None)
        rows.append({"instance_id": iid, "repo": repo_of({"instance_id": iid}), "outcome": outcome, "end_reason": how,
                     "wall_seconds": graded.get("duration_seconds"), "cost": graded.get("cost"),
                     "mask_reason": reason})
        diff = d / "patch.diff"
        patch = diff.read_text(encoding="utf-8", errors="replace") if diff.is_file() else None
        lines.append({"instance_id": iid, "outcome": outcome, "patch": patch, "report": {iid: graded},
                      "mask_reason": reason})
        if graded.get("model_name_or_path"):
            models.append(str(graded["model_name_or_path"]))
    scored = [r for r in rows if r["outcome"] in ("resolved", "unresolved")]
    resolved = sum(r["outcome"] == "resolved" for r in scored)
    report = {"model": models[0] if len(set(models)) == 1 else settings.get("predictions") or directory.name,
              "total": len(summary.get("total_ids") or ids), "completed": len(ids), "scored": len(scored),
              "resolved": resolved, "unresolved": len(scored) - resolved,
              "masked": sum(r["outcome"] == "masked" for r in rows),
              "resolved_rate": round(resolved / len(scored), 4) if scored else None,
              "ci95": [round(x, 4) for x in wilson(resolved, len(scored))] if scored else None,
              "wall_seconds": summary.get("seconds"), "cost": summary.get("cost"), "instances": rows}
    run = {"params": dict(settings), "tasks": summary.get("total_ids")} if settings else None
    if not settings:
        notes.append(f"{SETTINGS_FILE} is missing: no evaluation settings to show.")
    return Source("eval", directory, report, run, lines, None, notes)
