"""``/aggregate_metrics`` in NeMo Gym's own shape (``nemo_gym.reward_profile.compute_aggregate_metrics``),
over the verify responses a collection gathered, masked samples left out."""

import statistics
from typing import Any

from patchgym.server.nemo_gym.bodies import NemoGymAggregateMetrics

TASK_INDEX = "_ng_task_index"  # NeMo Gym's keys of a row's task and of its rollout of it
ROLLOUT_INDEX = "_ng_rollout_index"
# NeMo Gym's profiler's statistics, in its order (std: the sample's, 0 for a single value).
STATS = {"mean": statistics.fmean, "max": max, "min": min, "median": statistics.median,
         "std": lambda values: statistics.stdev(values) if len(values) > 1 else 0.0}


def _numeric_fields(response: dict[str, Any]) -> dict[str, float]:
    """The numbers NeMo Gym's reward profiler describes: every top-level number or bool of a verify
    response (bools as 0/1) and of its ``response.usage``, but the row indices."""
    usage = (response.get("response") or {}).get("usage") or {}
    fields: dict[str, float] = {}
    for source in (usage, response):
        for key, value in source.items():
            if key in (TASK_INDEX, ROLLOUT_INDEX) or not isinstance(value, int | float):
                continue
            fields[key] = float(value)
    return fields


def _describe(rows: list[dict[str, float]]) -> dict[str, float]:
    """``{stat}/{field}`` for each stat of :data:`STATS` and each field, as NeMo Gym's profiler writes them."""
    names = list(dict.fromkeys(k for r in rows for k in r))
    return {f"{stat}/{name}": fn([r[name] for r in rows if name in r]) for stat, fn in STATS.items() for name in names}


def aggregate(responses: list[dict[str, Any]]) -> NemoGymAggregateMetrics:
    """NeMo Gym's aggregate shape (``nemo_gym.reward_profile.compute_aggregate_metrics``): one
    ``group_level_metrics`` entry per ``_ng_task_index`` with ``{stat}/{field}`` over its rollouts
    and their ``rollout_infos``; ``agent_metrics`` with the same over every rollout; ``key_metrics``
    the ``mean/*`` ones. Masked samples (the infrastructure failed) are left out of every statistic,
    as training leaves them out, and counted in ``num_masked``."""
    if not responses:
        return NemoGymAggregateMetrics()
    by_task: dict[Any, list[dict[str, Any]]] = {}
    for r in responses:
        by_task.setdefault(r.get(TASK_INDEX, 0), []).append(r)
    groups, every = [], []
    for task_index in sorted(by_task, key=lambda k: (str(type(k)), k)):
        rows = by_task[task_index]
        scored = [(r, _numeric_fields(r)) for r in rows if not r.get("mask_sample")]
        every += [fields for _, fields in scored]
        infos = [{"rollout_id": f"{task_index}:{r.get(ROLLOUT_INDEX, 0)}", TASK_INDEX: task_index,
                  ROLLOUT_INDEX: r.get(ROLLOUT_INDEX, 0), **fields} for r, fields in scored]
        groups.append({TASK_INDEX: task_index, **_describe([f for _, f in scored]),
                       "instance_id": rows[0].get("instance_id"), "num_rollouts": len(scored),
                       "expected_num_rollouts": len(rows), "missing_num_rollouts": len(rows) - len(scored),
                       "num_masked": len(rows) - len(scored),
                       "rollout_infos": sorted(infos, key=lambda i: str(i[ROLLOUT_INDEX]))})
    agent = {**_describe(every),
             "num_samples": len(responses), "num_masked": len(responses) - len(every)}
    return NemoGymAggregateMetrics(group_level_metrics=groups, agent_metrics=agent,
                                   key_metrics={k: v for k, v in agent.items() if k.startswith("mean/")})

