"""Attacks on the sandbox bounds: disk and inode quotas, fork bombs, the harness's diff, Docker gc.

Each test attacks first (fill the disk, fork, sabotage the repository, race the gc), then checks
both the defense and what the agent or the operator is told.
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import sandbox_of_a_killed_process

from patchgym.sandboxes import ResourceLimits, SandboxError, WorkspaceError
from patchgym.sandboxes.mounts import mounts_under
from patchgym.tasks.backends import make_sandbox

ENOSPC = "No space left on device"
SMALL_DISK = ResourceLimits(disk_bytes=64 << 20, disk_files=3000)


@pytest.fixture
def small_sandbox(backend, calc_task):
    sb = make_sandbox(calc_task, backend, limits=SMALL_DISK)
    if backend == "local" and not sb.disk_bounded:
        sb.close()
        pytest.skip("local sandboxes cannot mount a bounded tmpfs here (not root?)")
    yield sb
    sb.close()


def _places(backend: str) -> list[str]:
    return ["/testbed", "/tmp", "/var/tmp", "/dev/shm"] if backend == "docker" else ["/testbed", "/tmp"]


# -- disk and inode quotas ---------------------------------------------------------------------


def test_filling_the_disk_with_dd_ends_in_enospc_everywhere(small_sandbox, backend):
    sb = small_sandbox
    for place in _places(backend):
        result = sb.exec(f"dd if=/dev/zero of={place}/fill bs=1M count=200 2>&1; echo rc=$?", timeout=60)
        assert ENOSPC in result.output and "rc=0" not in result.output, (place, result.output)
        size = int(sb.exec(f"stat -c %s {place}/fill").output)
        room = 4 << 20 if place == "/testbed" else 0  # Docker's /testbed also holds the repository itself
        assert size <= (64 << 20) + room, (place, size)
        sb.exec(f"rm -f {place}/fill")
    assert sb.exec("dd if=/dev/zero of=ok bs=1M count=8 2>&1 && echo wrote").output.strip().endswith("wrote")
    sb.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>/dev/null; dd if=/dev/zero of=fill bs=1M count=200")
    sb.reset()  # the harness stays healthy, and a reset gives the whole quota back
    assert sb.diff() == ""
    assert sb.exec("test -e /tmp/fill || echo cleared").output.strip() == "cleared"
    assert sb.exec("dd if=/dev/zero of=again bs=1M count=32 2>&1; echo rc=$?").output.strip().endswith("rc=0")


def test_many_small_files_end_in_enospc_everywhere(small_sandbox, backend):
    sb = small_sandbox
    for place in _places(backend):
        result = sb.exec(f"mkdir -p {place}/many && cd {place}/many && seq 6000 | xargs touch 2>&1 | tail -1; "
                         "ls | wc -l", timeout=60)
        assert ENOSPC in result.output, (place, result.output)
        assert int(result.output.split()[-1]) <= 3000, (place, result.output)
        sb.exec(f"rm -rf {place}/many")
    assert sb.exec("touch one-more && echo ok").output.strip() == "ok"


def test_every_place_the_docker_user_can_write_is_bounded(docker_base, calc_task):
    """Nothing outside the bounded tmpfs mounts is writable by the command user (uid 1000)."""
    probe = r"""
import os
mounts = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    sep = fields.index("-")
    mounts[fields[4]] = (fields[sep + 1], fields[5] + "," + fields[sep + 3])
for root, dirs, _ in os.walk("/"):
    if root in ("/proc", "/sys"):
        dirs[:] = []
        continue
    if os.access(root, os.W_OK):
        point = max((m for m in mounts if root == m or root.startswith(m.rstrip("/") + "/")), key=len)
        fstype, options = mounts[point]
        bounded = fstype == "tmpfs" and "size=" in options and "nr_inodes=" in options
        print("OK" if bounded or fstype == "mqueue" else "UNBOUNDED", root, point, fstype)
"""
    sb = make_sandbox(calc_task, "docker")
    try:
        sb.write_file("probe.py", probe)
        lines = sb.exec("python3 probe.py; rm probe.py").output.splitlines()
        assert lines and not [line for line in lines if not line.startswith("OK")], lines
        writable = {line.split()[1] for line in lines}
        assert {"/testbed", "/tmp", "/var/tmp", "/dev/shm"} <= writable
    finally:
        sb.close()


def test_overlay_workspace_keeps_the_shared_checkout_pristine(calc_task, calc_repo):
    sb = make_sandbox(calc_task)
    try:
        if not sb.disk_bounded:
            pytest.skip("no bounded overlay workspace here")
        template = sb._template
        before = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=template,
                                capture_output=True, text=True).stdout
        listing = sorted(str(p.relative_to(template)) for p in template.rglob("*"))
        out = sb.exec("stat -c %U calc/__init__.py; git mv tests/test_calc.py tests/test_moved.py && "
                      "rm calc/__init__.py && echo new > calc/new.py && mkdir -p deep/er && echo x > deep/er/f && "
                      "git add -A && git commit -qm agent && git status --porcelain | wc -l").output.split()
        assert out == ["root", "0"]
        sb.exec("git reset -q --hard HEAD~1")
        patch = calc_repo[1]["patch"]
        applied = sb.exec(f"printf %s {shlex.quote(patch)} | git apply && git diff --stat").output
        assert "calc/__init__.py" in applied
        assert sb.diff() == patch
        sb.exec("rm -rf ./* .git")
        assert sb.exec("ls -A | wc -l").output.strip() == "0"
        assert sorted(str(p.relative_to(template)) for p in template.rglob("*")) == listing
        assert subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=template,
                              capture_output=True, text=True).stdout == before
        sb.reset()
        assert sb.diff() == "" and sb.exec("git log --oneline | wc -l").output.strip() == "2"
    finally:
        sb.close()
    assert not mounts_under(sb.root) and not sb.root.exists()


def test_unbounded_fallback_warns_and_copies(calc_task, caplog, monkeypatch):
    import patchgym.sandboxes.local as local

    monkeypatch.setattr(local, "_warned_unbounded", False)
    monkeypatch.setattr(local, "quota_unavailable_reason", lambda: "PATCHGYM_NO_QUOTA=1")
    with caplog.at_level("WARNING"):
        sb = make_sandbox(calc_task)
    try:
        assert not sb.disk_bounded and "NOT bounded" in caplog.text
        assert not mounts_under(sb.root)
        sb.write_file("calc/new.py", "X = 1\n")
        assert "calc/new.py" in sb.diff()
        sb.reset()
        assert sb.diff() == ""
    finally:
        sb.close()


def test_a_killed_owner_leaves_no_mounts_and_the_checkout_intact(calc_task):
    from patchgym.sandboxes import reap_stale

    bounded, root, template = sandbox_of_a_killed_process(calc_task, (
        "sb.exec('echo dirty > calc/__init__.py; rm -rf tests; echo t > /tmp/t')\n"
        "print(sb.disk_bounded, sb.root, sb._template)"))
    root, template = Path(root), Path(template)
    if bounded != "True":
        pytest.skip("no bounded overlay workspace here")
    # The workspace's tmpfs and overlay live in the sandbox's own mount namespace: they died with it,
    # and the host's mount table never held them.
    assert not mounts_under(root), "the dead sandbox's mounts outlived its namespace on the host"
    files = sorted(p for p in template.rglob("*"))
    assert reap_stale() >= 1
    assert not root.exists() and not mounts_under(root)
    assert sorted(p for p in template.rglob("*")) == files
    assert "def mean" in (template / "calc" / "__init__.py").read_text()


def test_a_mount_that_cannot_be_removed_is_never_deleted_through(calc_task, monkeypatch):
    import patchgym.sandboxes.mounts as mounts

    sb = make_sandbox(calc_task)
    if not sb.disk_bounded:
        sb.close()
        pytest.skip("no bounded overlay workspace here")
    count = len(list(sb._template.rglob("*")))
    real_unmount_all = mounts.unmount_all
    monkeypatch.setattr(mounts, "unmount_all", lambda root: False)
    assert mounts.remove_tree(sb.root) is False
    assert sb.root.exists() and len(list(sb._template.rglob("*"))) == count
    monkeypatch.setattr(mounts, "unmount_all", real_unmount_all)
    sb.close()
    assert not sb.root.exists() and len(list(sb._template.rglob("*"))) == count


# -- fork bombs --------------------------------------------------------------------------------


def _pids_peak(sb, backend: str) -> int:
    if backend == "local":
        return int((sb._group.dirs["pids"] / "pids.peak").read_text())
    return int(sb.exec("cat /sys/fs/cgroup/pids/pids.peak 2>/dev/null || cat /sys/fs/cgroup/pids.peak").output)


def test_fork_bomb_ends_in_seconds_with_a_clear_marker(backend, calc_task):
    sb = make_sandbox(calc_task, backend, limits=ResourceLimits(max_processes=64))
    try:
        if backend == "local" and not (sb._group is not None and sb._group.active):
            pytest.skip("no pids cgroup here: a fork bomb would not be bounded")
        marker = "[patchgym: command killed: process limit (64) reached]"
        # First prove the bound with harmless sleeps: the tree never passes 64 and the watchdog ends it.
        proof = sb.exec("for i in $(seq 200); do sleep 60 & done; wait", timeout=60)
        assert marker in proof.output and proof.duration < 15, proof
        assert _pids_peak(sb, backend) <= 64
        start = time.monotonic()
        bomb = sb.exec(":(){ :|:& };:; sleep 600", timeout=300)
        elapsed = time.monotonic() - start
        assert marker in bomb.output, bomb.output[-500:]
        assert bomb.exit_code != 0 and not bomb.timed_out
        assert elapsed < 20, elapsed
        assert _pids_peak(sb, backend) <= 64
        if backend == "local":
            assert not sb.command_pids(), "fork bomb processes survived"
        assert sb.exec("echo still-usable").output.strip() == "still-usable"
        # a command that only touches the limit briefly is not killed
        brief = sb.exec("for i in $(seq 80); do sleep 0.3 & done 2>/dev/null; wait; echo done", timeout=60)
        assert marker not in brief.output and brief.output.strip().endswith("done")
    finally:
        sb.close()


def test_watchdog_needs_the_limit_to_stay_hit(tmp_path):
    from patchgym.sandboxes.process import ProcessLimitWatch

    (tmp_path / "pids.max").write_text("10\n")
    (tmp_path / "pids.current").write_text("10\n")
    (tmp_path / "pids.events").write_text("max 0\n")
    watch = ProcessLimitWatch(tmp_path, hold=0.3, poll=0.0, gap=0.2)
    assert watch() is None and watch.limit == 10  # the first look only reads the limit and the counter
    assert watch() is None  # at the limit, but no fork has failed: a full pool is not a bomb
    (tmp_path / "pids.events").write_text("max 5\n")
    assert watch() is None  # forks fail now: the clock starts
    fired = []
    for _ in range(10):  # the tree stays at the limit, polled as run_capped does
        time.sleep(0.05)
        fired.append(watch())
    assert fired[:4] == [None] * 4 and fired[-1] == "process limit (10) reached"
    (tmp_path / "pids.current").write_text("3\n")
    watch = ProcessLimitWatch(tmp_path, hold=0.3, poll=0.0, gap=0.2)
    assert watch() is None
    (tmp_path / "pids.events").write_text("max 6\n")
    assert watch() is None
    time.sleep(0.05)
    (tmp_path / "pids.events").write_text("max 6\n")
    for _ in range(8):  # one failed fork, then the tree shrinks: no bomb
        time.sleep(0.05)
        assert watch() is None
    (tmp_path / "pids.max").write_text("max\n")
    unlimited = ProcessLimitWatch(tmp_path, poll=0.0)
    assert unlimited() is None and unlimited() is None and unlimited.limit is None  # nothing to watch


# -- the harness's diff -------------------------------------------------------------------------


def test_workspace_error_is_the_agents_failure_not_infrastructure():
    import patchgym.sandboxes as sandboxes

    assert issubclass(WorkspaceError, Exception) and not issubclass(WorkspaceError, SandboxError)
    assert sandboxes.WorkspaceError is WorkspaceError


@pytest.fixture
def sandbox(backend, calc_task):
    sb = make_sandbox(calc_task, backend)
    yield sb
    sb.close()


EDIT = "printf 'X = 1\\n' >> calc/__init__.py"


def _edit_only(diff: str) -> bool:
    return diff.count("diff --git") == 1 and "+X = 1" in diff and "a/calc/__init__.py" in diff


@pytest.mark.parametrize("sabotage", [
    "rm -rf .git",
    "chmod 000 .git",
    "chmod -R 000 .",
    "git rm -rq --cached . && git commit -qm 'all gone' && git checkout -q --orphan other",
    "printf '[core]\\n\\tfsmonitor = \"touch /tmp/pwned-fsmonitor; echo\"\\n\\thooksPath = /tmp\\n"
    "[diff]\\n\\texternal = /tmp/pwned.sh\\n[filter \"evil\"]\\n\\tclean = sh -c \"touch /tmp/pwned-filter\"\\n' "
    ">> .git/config && printf '#!/bin/sh\\ntouch /tmp/pwned-hook\\n' > .git/hooks/pre-commit",
])
def test_diff_ignores_what_the_agent_did_to_git(sandbox, sabotage):
    sandbox.exec(f"{EDIT} && {sabotage}")
    start = time.monotonic()
    diff = sandbox.diff()
    assert _edit_only(diff), diff
    assert time.monotonic() - start < 10
    assert "pwned" not in sandbox.exec("ls /tmp").output  # an unreadable workspace is no excuse to fail
    assert not list(Path("/tmp").glob("pwned*"))


def test_an_unreadable_workspace_fails_the_command_not_the_sandbox(sandbox):
    sandbox.exec("chmod -R 000 .")
    result = sandbox.exec("echo unreachable")
    assert result.exit_code != 0 and "Permission denied" in result.output
    assert "unreachable" not in result.output
    sandbox.reset()
    assert sandbox.exec("echo back").output.strip() == "back"


def test_in_tree_gitattributes_cannot_change_the_diff(sandbox):
    sandbox.exec("printf '* filter=evil ident eol=crlf working-tree-encoding=UTF-16 -diff\\n' > .gitattributes && "
                 "printf '[filter \"evil\"]\\n\\tclean = false\\n' >> .git/config && "
                 "printf '$Id: agent $\\nline\\n' > calc/ident.txt")
    diff = sandbox.diff()
    assert "Binary files" not in diff and "GIT binary patch" not in diff
    assert "+$Id: agent $" in diff and "+line" in diff and "\r" not in diff
    assert "b/.gitattributes" in diff  # recorded as a file like any other


def test_nested_repositories_are_plain_directories(sandbox):
    sandbox.exec("mkdir -p vendored/lib && cd vendored && git init -q && echo y > lib/f.txt && cd .. && "
                 "mkdir -p other && cd other && git init -q && echo z > g.txt && git add g.txt && "
                 "git -c user.name=a -c user.email=a@b commit -qm x && cd .. && mkdir -p weird/.GIT && "
                 "echo hidden > weird/.GIT/config && echo kept > weird/kept")
    diff = sandbox.diff()
    for path in ("vendored/lib/f.txt", "other/g.txt", "weird/kept"):
        assert f"b/{path}" in diff, path
    assert "Subproject" not in diff and "160000" not in diff and "hidden" not in diff
    assert "/.git/" not in diff and ".GIT" not in diff


def test_special_files_symlinks_and_oversize_files(sandbox, backend):
    sb = sandbox
    make_socket = "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\""
    sb.exec(f"mkfifo fifo && {make_socket} && ln -s /etc/shadow shadow && ln -s ../../../.. up && "
            "ln -s /dev/zero calc/zero && ln -s /dev/zero .gitignore")
    start = time.monotonic()
    diff = sb.diff()
    assert time.monotonic() - start < 10
    assert "b/fifo" not in diff and "b/sock" not in diff  # untracked FIFOs and sockets are not content
    for link, target in (("shadow", "/etc/shadow"), ("up", "../../../.."), ("calc/zero", "/dev/zero"),
                         (".gitignore", "/dev/zero")):
        assert f"diff --git a/{link} b/{link}\nnew file mode 120000" in diff and f"+{target}" in diff, link
    assert "root:" not in diff  # symlinks are recorded, never followed

    sb.exec("rm .gitignore && mkfifo .gitignore")
    with pytest.raises(WorkspaceError, match=r"\.gitignore is not a regular file"):
        sb.diff()
    sb.exec("rm .gitignore && rm calc/__init__.py && mkfifo calc/__init__.py")
    with pytest.raises(WorkspaceError, match=r"calc/__init__.py is not a regular file"):
        sb.diff()
    sb.exec("rm calc/__init__.py && git checkout -q calc/__init__.py && truncate -s 1G big.bin")
    start = time.monotonic()
    with pytest.raises(WorkspaceError, match="the workspace diff is larger than 8 MiB"):
        sb.diff()
    assert time.monotonic() - start < 10
    sb.exec("rm big.bin")
    assert "b/shadow" in sb.diff()


@pytest.fixture
def roomy_sandbox(backend, calc_task):
    """A sandbox whose diff may reach 64 MiB (the default bound is 8)."""
    sb = make_sandbox(calc_task, backend, limits=ResourceLimits(diff_bytes=64 << 20))
    yield sb
    sb.close()


def test_a_large_legal_diff_is_fast(roomy_sandbox):
    sandbox = roomy_sandbox
    sandbox.exec("head -c 30000000 /dev/urandom | base64 -w 100 > data.txt && mkdir many && cd many && "
                 "seq 5000 | xargs touch && echo edit >> ../README.md 2>/dev/null; true", timeout=120)
    start = time.monotonic()
    diff = sandbox.diff()
    elapsed = time.monotonic() - start
    assert diff.count("diff --git") >= 5001 and len(diff) > 40_000_000
    assert elapsed < 15, elapsed


def test_three_hundred_thousand_files_give_a_diff_or_a_reason(calc_task):
    sb = make_sandbox(calc_task, limits=ResourceLimits(disk_files=400_000))
    try:
        made = sb.exec("mkdir -p f && cd f && seq 300000 | xargs touch && ls | wc -l", timeout=300)
        assert made.output.strip() == "300000", made.output
        start = time.monotonic()
        with pytest.raises(WorkspaceError, match="the workspace diff has more than 100000 new and changed files"):
            sb.diff()
        assert time.monotonic() - start < 15
        sb.exec("find f -name '*[0-9][0-9][0-9][0-9]' -delete")  # 999 left: a legal diff again
        assert sb.diff().count("diff --git") == 999
    finally:
        sb.close()


# -- Docker gc ----------------------------------------------------------------------------------


@pytest.fixture
def docker(docker_base):
    from patchgym.sandboxes.docker import docker_client

    return docker_client()


def _labelled(docker, image: str, owner: str, n: int = 1) -> list:
    labels = {"org.patchgym.managed": "1", "org.patchgym.kind": "sandbox", "org.patchgym.owner": owner}
    return [docker.containers.create(image, ["sleep", "300"], labels=labels) for _ in range(n)]


def _cleanup(containers) -> None:
    for c in containers:
        try:
            c.remove(force=True)
        except Exception:
            pass


def test_two_gcs_racing_never_crash_and_remove_each_container_once(docker, docker_base):
    from patchgym.sandboxes.docker import gc_containers
    from patchgym.sandboxes.docker.client import owner_id

    dead = _labelled(docker, docker_base, f"{owner_id().split(':')[0]}:999999", 8)
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(gc_containers())
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        ids = {c.id[:12] for c in dead}
        assert ids <= set(results[0]) | set(results[1])
        assert not (set(results[0]) & set(results[1]) & ids), "a container was reported removed twice"
    finally:
        _cleanup(dead)


def test_gc_skips_a_container_that_vanishes_under_it(docker, docker_base, monkeypatch):
    from patchgym.sandboxes.docker import gc_containers
    from patchgym.sandboxes.docker.client import owner_id

    gone, kept = _labelled(docker, docker_base, f"{owner_id().split(':')[0]}:999999", 2)
    real_list = type(docker.containers).list

    def list_then_vanish(self, *args, **kwargs):
        found = real_list(self, *args, **kwargs)
        gone.remove(force=True)  # another process removes it between the listing and our removal
        return found

    monkeypatch.setattr(type(docker.containers), "list", list_then_vanish)
    try:
        removed = gc_containers()
        assert kept.id[:12] in removed and gone.id[:12] not in removed
    finally:
        _cleanup([gone, kept])


def test_gc_leaves_other_hosts_alone_unless_all(docker, docker_base, monkeypatch):
    from typer.testing import CliRunner

    import patchgym.cli as cli
    import patchgym.sandboxes as sandboxes
    import patchgym.sandboxes.docker as sd
    from patchgym.sandboxes.docker import gc_containers

    foreign = _labelled(docker, docker_base, "some-other-host.invalid:1")[0]
    try:
        left: list[str] = []
        assert foreign.id[:12] not in gc_containers(kept=left)
        assert docker.containers.get(foreign.id)
        assert any(line.startswith(f"{foreign.name}: owned by some-other-host.invalid:1, another host")
                   for line in left), left  # gc says what it left, and why
        assert foreign.id[:12] in gc_containers(other_hosts=True)
    finally:
        _cleanup([foreign])
    calls: list[dict] = []
    monkeypatch.setattr(sd, "gc_containers", lambda **kw: calls.append(kw) or [])
    monkeypatch.setattr(sandboxes, "reap_stale", lambda: 0)  # the command imports it when it runs
    for args in (["sandboxes", "gc"], ["sandboxes", "gc", "--all"]):
        assert CliRunner().invoke(cli.app, args).exit_code == 0
    assert calls == [{"include_live_owners": False, "other_hosts": False, "kept": []},
                     {"include_live_owners": True, "other_hosts": True, "kept": []}]
