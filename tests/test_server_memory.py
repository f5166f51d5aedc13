"""What one submit costs the server's memory, whatever the agent wrote: a 250 MiB file in the
workspace once raised ``patchgym serve`` from 92 MiB to 1.2-1.4 GiB on both backends. The diff the
grader takes is bounded (``ResourceLimits.diff_bytes``, 8 MiB) and refused before it is read, and
one just under the bound is never held whole (graded on the local backend only: a grading run in
Docker costs the suite ~30 s, and past the diff both backends grade alike)."""

from __future__ import annotations

import pytest

from tests.test_server_connections import serve_process

TASK = "fixture__calc-1"
MIB = 1 << 20
BIG_FILE_BOUND = 48 * MIB  # the server's peak RSS may grow this much over a 250 MiB file's submit
NEAR_CAP_BOUND = 160 * MIB  # ... and this much over a diff just under the 8 MiB cap, graded


def status_bytes(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def submit_after(client, command: str) -> dict:
    """A session's submit after ``command``; the session deleted."""
    sid = client.post("/v1/sessions", json={"task_id": TASK}).json()["session_id"]
    made = client.post(f"/v1/sessions/{sid}/step",
                       json={"action": {"name": "bash", "arguments": {"command": command}}}).json()
    assert "[exit code: 0]" in made["observation"], made
    result = client.post(f"/v1/sessions/{sid}/step", json={"action": {"name": "submit", "arguments": {}}})
    assert result.status_code == 200, result.text
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    return result.json()


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_a_huge_workspace_file_leaves_the_servers_memory_bounded(backend, request, calc_tasks_file, tmp_path):
    if backend == "docker":
        request.getfixturevalue("docker_base")
    import httpx

    with serve_process(calc_tasks_file, tmp_path / "serve.log", "--max-sessions", "1", "--backend", backend) \
            as (url, proc), httpx.Client(base_url=url, timeout=600) as client:
        before = status_bytes(proc.pid, "VmHWM")
        big = submit_after(client, "yes 'a line of text in a big file that weighs on whoever reads it whole' "
                                   "| head -c 262144000 > big.txt")
        grown = status_bytes(proc.pid, "VmHWM") - before
        assert big["terminated"] and big["reward"] == 0.0 and not big["info"]["infrastructure_failure"], big
        assert big["info"]["outcome"] == "agent_failure", big["info"]
        assert "larger than 8 MiB" in big["info"]["report"]["error"], big["info"]["report"]
        assert grown < BIG_FILE_BOUND, f"the server's peak RSS grew {grown / MIB:.0f} MiB"
        if backend == "docker":  # the path below is the backends' shared one once the diff is in
            return

        before = status_bytes(proc.pid, "VmHWM")
        near = submit_after(client, "yes 'sixty characters of text in a file just under the diff cap!' "
                                    "| head -c 7800000 > near.txt")
        grown = status_bytes(proc.pid, "VmHWM") - before
        assert near["terminated"] and near["info"]["report"]["patch_successfully_applied"], near["info"]["report"]
        assert grown < NEAR_CAP_BOUND, f"the server's peak RSS grew {grown / MIB:.0f} MiB"
        print(f"{backend}: peak RSS {status_bytes(proc.pid, 'VmHWM') / MIB:.0f} MiB, grown {grown / MIB:.0f} MiB")
