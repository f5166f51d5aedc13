"""An episode's model calls as one training sample: the multi-step run as one response with its
token ids (what NeMo Gym 0.6 does with a harness's calls), for a trainer to take as it is.

Each call the proxy recorded with token ids (:mod:`patchgym.rollouts.proxy`) holds the prompt's ids
and the generated ids. When a call's prompt begins with everything before it (the previous prompt,
then what the model generated), the run is one sequence: the first prompt, then, in turn, the
model's tokens (``response_mask`` 1, their log-probabilities) and the tokens the harness added
between two calls (tool output, its own notes: mask 0, log-probability 0). A harness that rewrote
its history (dropped old turns, reformatted them) breaks that: the sample then has one segment per
unbroken stretch, and says so (``contiguous`` false), rather than glue sequences the model never saw.
"""

from __future__ import annotations

from typing import Any


def training_sample(calls: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The sample of recorded ``calls`` (None when no call carried token ids):
    ``{"contiguous", "segments": [{"prompt_token_ids", "response_token_ids", "response_mask",
    "response_logprobs", "calls"}], "calls_with_tokens", "calls_without_tokens"}``."""
    segments: list[dict[str, Any]] = []
    with_tokens = without = 0
    for call in calls:
        if call.get("status") != 200:
            continue
        prompt, generated = call.get("prompt_token_ids"), call.get("token_ids")
        if not prompt or not generated:
            without += 1
            continue
        with_tokens += 1
        logprobs = call.get("logprobs") or [0.0] * len(generated)
        segment = segments[-1] if segments else None
        seen = (segment["prompt_token_ids"] + segment["response_token_ids"]) if segment else None
        if segment is None or seen is None or prompt[:len(seen)] != seen:
            segment = {"prompt_token_ids": list(prompt), "response_token_ids": [], "response_mask": [],
                       "response_logprobs": [], "calls": []}
            segments.append(segment)
        else:
            added = prompt[len(seen):]
            segment["response_token_ids"] += added
            segment["response_mask"] += [0] * len(added)
            segment["response_logprobs"] += [0.0] * len(added)
        segment["response_token_ids"] += generated
        segment["response_mask"] += [1] * len(generated)
        segment["response_logprobs"] += [float(x) for x in logprobs]
        segment["calls"].append(call.get("index"))
    if not segments:
        return None
    return {"contiguous": len(segments) == 1 and without == 0, "segments": segments,
            "calls_with_tokens": with_tokens, "calls_without_tokens": without}
