"""Where an endpoint's answer keeps its token ids and log-probabilities, and how to ask for them:
what the recording proxy (:mod:`patchgym.rollouts.proxy`) records beside each call, for training.

Chat completions: vLLM's ``return_token_ids`` (>= 0.10.2: ``prompt_token_ids`` and
``choices[0].token_ids``), the OpenAI API's ``logprobs`` (and older vLLM's "token_id:N" tokens in
them, with ``return_tokens_as_token_ids``).

Responses: vLLM's ``enable_response_messages`` (the prompt and the generation as
``input_messages`` / ``output_messages`` of type ``raw_message_tokens``, each with its
``tokens``), or a NeMo Gym model server's training fields (``prompt_token_ids``,
``generation_token_ids``, ``generation_log_probs`` on the one output item that carries them).

Nothing is guessed: ids that are not all integers, or log-probabilities that do not match the ids
one for one, are left out.
"""

from __future__ import annotations

from typing import Any

# Fields added to a request to get token ids back, by API (an endpoint that refuses them is asked
# again without them, and not asked any more: rollouts.proxy).
ASK = {"chat": {"logprobs": True, "return_token_ids": True, "return_tokens_as_token_ids": True},
       "responses": {"enable_response_messages": True}}
CHOICE_FIELDS = ("logprobs", "token_ids", "prompt_token_ids")
ITEM_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")


def token_info(api: str, answer: dict[str, Any]) -> dict[str, Any]:
    """What a call's record holds beside the answer: ``finish_reason``, and ``prompt_token_ids``,
    ``token_ids`` and ``logprobs`` where the answer has them."""
    return _chat_info(answer) if api == "chat" else _responses_info(answer)


def without_token_fields(api: str, answer: dict[str, Any]) -> dict[str, Any]:
    """The answer as recorded: token ids and log-probabilities are kept apart, once."""
    if api != "chat":
        out = {k: v for k, v in answer.items() if k not in ("input_messages", "output_messages")}
        if isinstance(out.get("output"), list):
            out["output"] = [{k: v for k, v in item.items() if k not in ITEM_FIELDS} if isinstance(item, dict)
                             else item for item in out["output"]]
        return out
    out = {k: v for k, v in answer.items() if k != "prompt_token_ids"}
    if isinstance(out.get("choices"), list):
        out["choices"] = [{k: v for k, v in c.items() if k not in CHOICE_FIELDS} if isinstance(c, dict) else c
                          for c in out["choices"]]
    return out


def _chat_info(answer: dict[str, Any]) -> dict[str, Any]:
    try:
        choice = answer["choices"][0]
    except (KeyError, IndexError, TypeError):
        return {}
    info: dict[str, Any] = {"finish_reason": choice.get("finish_reason")}
    prompt = answer.get("prompt_token_ids") or choice.get("prompt_token_ids")
    content = ((choice.get("logprobs") or {}).get("content")) or []
    logprobs = [float(t["logprob"]) for t in content if isinstance(t, dict) and "logprob" in t]
    ids = choice.get("token_ids")
    if not _ints(ids) and content:
        parsed = [_token_id(t.get("token")) for t in content if isinstance(t, dict)]
        ids = parsed if parsed and all(i is not None for i in parsed) else None
    return {**info, **_tokens(prompt, ids, logprobs)}


def _responses_info(answer: dict[str, Any]) -> dict[str, Any]:
    details = answer.get("incomplete_details") if answer.get("status") == "incomplete" else None
    info: dict[str, Any] = {"finish_reason": (details or {}).get("reason") or answer.get("status")}
    carriers = [item for item in answer.get("output") or []
                if isinstance(item, dict) and item.get("generation_token_ids") is not None]
    if len(carriers) == 1:  # NeMo Gym: exactly one output item carries the call's tokens
        item = carriers[0]
        return {**info, **_tokens(item.get("prompt_token_ids"), item.get("generation_token_ids"),
                                  item.get("generation_log_probs"))}
    if carriers:  # more than one: which is whose is a guess
        return info
    return {**info, **_tokens(_message_tokens(answer.get("input_messages")),
                              _message_tokens(answer.get("output_messages")), None)}


def _message_tokens(messages: Any) -> list[int] | None:
    """vLLM's ``raw_message_tokens`` messages, their tokens end to end (None unless all are integers)."""
    if not isinstance(messages, list) or not messages:
        return None
    ids: list[Any] = []
    for message in messages:
        tokens = message.get("tokens") if isinstance(message, dict) else None
        if not _ints(tokens):
            return None
        ids += tokens
    return ids


def _tokens(prompt: Any, ids: Any, logprobs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if _ints(prompt):
        out["prompt_token_ids"] = list(prompt)
    if _ints(ids):
        out["token_ids"] = list(ids)
    numbers = isinstance(logprobs, list) and bool(logprobs) and all(
        type(x) in (int, float) for x in logprobs)
    if numbers and (not _ints(ids) or len(logprobs) == len(ids)):
        out["logprobs"] = [float(x) for x in logprobs]
    return out


def _ints(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(i) is int for i in value)


def _token_id(token: Any) -> int | None:
    if isinstance(token, str) and token.startswith("token_id:") and token[9:].isdigit():
        return int(token[9:])
    return None
