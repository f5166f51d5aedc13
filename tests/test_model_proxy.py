"""The recording model proxy (rollouts/proxy.py) over real HTTP, between a client and the scripted
endpoint (tests/fake_openai.py): what it forwards, what it records (token ids included), what the
harness cannot choose, how it ends an episode; and the training sample built from its record."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from patchgym.rollouts.model import ModelConfig
from patchgym.rollouts.proxy import ModelProxy, expand_requests
from patchgym.rollouts.samples import training_sample
from tests.fake_openai import FakeModel, Turn, call, item_tokens, scripted_endpoint, tokens


@pytest.fixture
def fake():
    with scripted_endpoint() as model:
        yield model


def config(fake: FakeModel, **kw) -> ModelConfig:
    return ModelConfig(name="scripted", base_url=fake.url, api_key="sk-real-key", backoff=0.01,
                       **{"timeout": 30, "retries": 1, **kw})


def chat(url: str, messages: list[dict], **body) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", json={"model": "whatever", "messages": messages, **body},
                      headers={"Authorization": "Bearer harness-key"}, timeout=30)


def test_calls_are_forwarded_and_recorded_with_their_token_ids(fake):
    fake.default = [call("bash", {"command": "ls"}), Turn(text="done")]
    with ModelProxy(config(fake, temperature=0.3)) as proxy:
        first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "fix it"}]
        reply = chat(proxy.url, first, temperature=1.5).json()["choices"][0]["message"]
        second = first + [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "a b"}]
        assert chat(proxy.url, second).json()["choices"][0]["message"]["content"] == "done"
    sent = fake.requests
    # the run's model and sampling, not the harness's; token ids asked for
    assert [b["model"] for b in sent] == ["scripted", "scripted"] and sent[0]["temperature"] == 0.3
    assert sent[0]["return_token_ids"] is True and sent[0]["logprobs"] is True
    first_call, second_call = proxy.calls
    assert first_call["prompt_token_ids"] == [t for m in first for t in tokens(m)]
    assert first_call["token_ids"] == tokens(reply) and first_call["logprobs"] == [-0.5] * len(tokens(reply))
    assert "token_ids" not in json.dumps(first_call["response"]), "kept once, beside the answer"
    assert first_call["tokens_in"] == 100 and second_call["tokens_in"] == 110 and proxy.usage() == (210, 14)
    # the second request stores only what the first did not hold; expanded, both are whole
    assert second_call["request"]["prefix"] == {"field": "messages", "items": 2}
    assert [r["messages"] for r in expand_requests(proxy.calls)] == [first, second]
    # the multi-step run as one response: the reply generated (mask 1), the tool output added (mask 0)
    sample = training_sample(proxy.calls)
    assert sample["contiguous"] and len(sample["segments"]) == 1
    segment = sample["segments"][0]
    tool_tokens = tokens(second[-1])
    assert segment["response_token_ids"] == tokens(reply) + tool_tokens + tokens({"role": "assistant", "content": "done"})
    done = tokens({"role": "assistant", "content": "done"})
    assert segment["response_mask"] == [1] * len(tokens(reply)) + [0] * len(tool_tokens) + [1] * len(done)
    assert segment["response_logprobs"][len(tokens(reply))] == 0.0


def test_a_harness_that_rewrites_its_history_gets_segments_not_a_glued_sequence():
    calls = [{"status": 200, "index": 0, "prompt_token_ids": [1, 2], "token_ids": [3]},
             {"status": 200, "index": 1, "prompt_token_ids": [1, 2, 3, 4], "token_ids": [5]},
             {"status": 200, "index": 2, "prompt_token_ids": [1, 9], "token_ids": [6]},  # history rewritten
             {"status": 200, "index": 3, "prompt_token_ids": [], "token_ids": []}]
    sample = training_sample(calls)
    assert not sample["contiguous"] and sample["calls_without_tokens"] == 1
    assert [s["calls"] for s in sample["segments"]] == [[0, 1], [2]]
    assert sample["segments"][0]["response_token_ids"] == [3, 4, 5]
    assert sample["segments"][0]["response_mask"] == [1, 0, 1]
    assert training_sample([{"status": 200, "index": 0}]) is None


def test_an_endpoint_that_refuses_the_token_fields_is_asked_without_them(fake):
    fake.token_fields = False
    fake.default = [Turn(text="one"), Turn(text="two")]
    with ModelProxy(config(fake)) as proxy:
        messages = [{"role": "user", "content": "hi"}]
        assert chat(proxy.url, messages).status_code == 200
        assert chat(proxy.url, messages + [{"role": "assistant", "content": "one"}]).status_code == 200
    assert ["return_token_ids" in b for b in fake.requests] == [True, False, False], "asked once, then never"
    assert all(c["status"] == 200 and "token_ids" not in c for c in proxy.calls)


def test_streaming_clients_get_the_answer_as_server_sent_events(fake):
    fake.default = [call("bash", {"command": "ls"})]
    with ModelProxy(config(fake)) as proxy:
        r = chat(proxy.url, [{"role": "user", "content": "hi"}], stream=True, stream_options={"include_usage": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert events[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == "bash"
    assert events[0]["choices"][0]["delta"]["tool_calls"][0]["index"] == 0 and events[1]["usage"]["prompt_tokens"]
    assert r.text.rstrip().endswith("data: [DONE]") and "stream" not in fake.requests[0]


def test_the_responses_api_streams_as_the_openai_api_does_and_records_token_ids(fake):
    """Codex CLI's API: the OpenAI SDK's stream accumulator (which checks every delta against the
    part it was opened for) rebuilds the same response from the proxy's events; token ids are asked
    for as vLLM takes them, and read as vLLM and NeMo Gym's model servers return them."""
    from openai import OpenAI

    fake.default = [Turn(calls=[("shell", {"command": ["ls"]})], text="looking"), Turn(text="done")]
    first = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    with ModelProxy(config(fake)) as proxy:
        client = OpenAI(base_url=proxy.url, api_key="harness-key", max_retries=0)
        with client.responses.stream(model="x", input=first) as stream:
            kinds = [event.type for event in stream]
            streamed = stream.get_final_response()
        raw = httpx.post(f"{proxy.url}/responses", json={"model": "x", "input": first, "stream": True}, timeout=30)
        fake.responses_tokens = "nemo"
        second = first + [item.model_dump(exclude_none=True) for item in streamed.output] + [
            {"type": "function_call_output", "call_id": streamed.output[0].call_id, "output": "a.txt"}]
        assert client.responses.create(model="x", input=second).output_text == "done"
    assert streamed.output[0].name == "shell" and streamed.output[1].content[0].text == "looking"
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert {"response.function_call_arguments.delta", "response.output_text.delta",
            "response.content_part.done"} <= set(kinds)
    assert raw.text.count("event: response.output_item.done") == 2
    assert fake.requests[0]["enable_response_messages"] is True and fake.requests[0]["model"] == "scripted"
    one, _, two = proxy.calls
    assert one["api"] == "responses" and one["response"]["output"][0]["name"] == "shell" and one["tokens_in"] == 100
    assert one["prompt_token_ids"] == [t for item in first for t in item_tokens(item)]
    assert one["token_ids"] == [t for item in one["response"]["output"] for t in item_tokens(item)]
    assert "input_messages" not in one["response"], "kept once, beside the answer"
    assert two["logprobs"] == [-0.25] * len(two["token_ids"]) and "generation_token_ids" not in json.dumps(two)
    assert [r["input"] for r in expand_requests(proxy.calls)][2] == second
    # the run as one sample: the tool output the harness added between the calls, mask 0
    sample = training_sample([one, two])
    assert sample["contiguous"] and sample["segments"][0]["response_mask"].count(0) == len(item_tokens(second[-1]))


def test_the_key_stays_with_the_proxy_and_the_harness_cannot_choose_the_upstream(fake):
    fake.default = [Turn(text="ok")]
    with ModelProxy(config(fake)) as proxy:
        chat(proxy.url, [{"role": "user", "content": "hi"}], base_url="http://169.254.169.254", api_base="x")
        for path in ("/../../admin", "/completions", "/embeddings"):
            assert httpx.post(f"{proxy.url}{path}", json={}, timeout=10).status_code in (404, 405)
    assert fake.authorizations == ["Bearer sk-real-key"], "one upstream call, with the proxy's key, never the harness's"


def test_budget_failure_and_bad_bodies(fake):
    fake.default = [Turn(text="a"), Turn(text="b"), Turn(text="c")]
    stops: list[str] = []
    with ModelProxy(config(fake), max_calls=2, on_stop=stops.append) as proxy:
        messages = [{"role": "user", "content": "hi"}]
        assert httpx.post(f"{proxy.url}/chat/completions", content=b"\xff not json", timeout=10).status_code == 400
        assert httpx.post(f"{proxy.url}/chat/completions", json=[1], timeout=10).status_code == 400
        assert chat(proxy.url, messages).status_code == 200
        assert chat(proxy.url, messages + [{"role": "assistant", "content": "a"}]).status_code == 200
        refused = chat(proxy.url, messages)
        assert refused.status_code == 400 and "model calls are spent" in refused.text
    assert len(proxy.calls) == 2 and proxy.failure is None and stops == ["the episode's 2 model calls are spent"]
    # an endpoint that keeps failing: masked (failure), and the harness is told to stop
    fake.default = [Turn(failures=9, status=503)]
    with ModelProxy(config(fake)) as proxy:
        r = chat(proxy.url, [{"role": "user", "content": "hi"}])
        assert r.status_code == 502 and "503" in proxy.failure and proxy.stopped
        assert chat(proxy.url, [{"role": "user", "content": "again"}]).status_code == 400
    # a request the endpoint rejects for its content is the harness's doing: passed on, not masked
    fake.default = [Turn(failures=9, status=422, error="messages must be a list")]
    with ModelProxy(config(fake)) as proxy:
        r = chat(proxy.url, [{"role": "user", "content": "hi"}])
        assert r.status_code == 422 and "must be a list" in r.text and proxy.failure is None


def test_the_unix_socket_is_served_too(fake, tmp_path):
    fake.default = [Turn(text="through the socket")]
    path = tmp_path / "m.sock"
    with ModelProxy(config(fake), unix_socket=path) as proxy:
        transport = httpx.HTTPTransport(uds=str(path))
        with httpx.Client(transport=transport, base_url="http://proxy/v1") as client:
            r = client.post("/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.json()["choices"][0]["message"]["content"] == "through the socket"
        assert oct(path.stat().st_mode & 0o777) == "0o666"
        host, port = proxy.url.removeprefix("http://").split("/")[0].split(":")
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    assert not path.exists(), "the socket goes with the proxy"
