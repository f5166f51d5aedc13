"""A command-line agent for the tests of the command harness, run inside the sandbox by the task's
Python (standard library only): mini-swe-agent's protocol in a page. It asks the model at
``$OPENAI_BASE_URL`` with one ``bash`` tool, runs each call, and stops when a command's output
starts with ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, when the model calls no tool, or when a call
fails (exit 1). ``--stream`` asks for streamed answers (the proxy's server-sent events)."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a bash command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def ask(messages, stream):
    body = {"model": os.environ["PATCHGYM_MODEL"], "messages": messages, "tools": [BASH], "stream": stream}
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    with urllib.request.urlopen(request, timeout=120) as response:
        text = response.read().decode()
    if not stream:
        return json.loads(text)["choices"][0]["message"]
    message = {"role": "assistant", "content": None, "tool_calls": []}
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:])["choices"]:
            delta = choice["delta"]
            message["content"] = delta.get("content") or message["content"]
            for call in delta.get("tool_calls") or []:
                message["tool_calls"].append({k: v for k, v in call.items() if k != "index"})
    if not message["tool_calls"]:
        del message["tool_calls"]
    return message


def main():
    stream = "--stream" in sys.argv
    with open(os.environ["PATCHGYM_TASK_FILE"]) as fh:
        task = fh.read()
    messages = [{"role": "system", "content": "You fix bugs with bash."}, {"role": "user", "content": task}]
    for _ in range(50):
        try:
            message = ask(messages, stream)
        except urllib.error.HTTPError as exc:
            print("the model call failed:", exc.code, exc.read().decode()[:500])
            return 1
        messages.append(message)
        if not message.get("tool_calls"):
            return 0
        for call in message["tool_calls"]:
            command = json.loads(call["function"]["arguments"])["command"]
            done = subprocess.run(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            output = done.stdout.decode(errors="replace")
            if output.lstrip().startswith(SUBMIT) and done.returncode == 0:
                return 0
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return 0


if __name__ == "__main__":
    sys.exit(main())
