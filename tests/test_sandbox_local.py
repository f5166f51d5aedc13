"""The local sandbox: exec semantics, pristine workspaces without future history, isolation, limits."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import sandbox_of_a_killed_process

from patchgym.sandboxes import (
    LocalSandbox,
    PathOutsideWorkspaceError,
    ResourceLimits,
    SandboxClosedError,
    SandboxError,
)
from patchgym.sandboxes.isolation import bwrap_path

if os.environ.get("PATCHGYM_REQUIRE_BWRAP") == "1" and bwrap_path() is None:
    raise RuntimeError("PATCHGYM_REQUIRE_BWRAP=1 but bubblewrap is not usable here")
needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap is not usable on this host")


def test_exec_reports_exit_code_output_and_duration(calc_sandbox):
    result = calc_sandbox.exec("echo out; echo err >&2; exit 3")
    assert result.exit_code == 3
    assert "out" in result.output and "err" in result.output
    assert not result.timed_out and result.duration > 0
    assert calc_sandbox.exec("pwd").output.strip() == calc_sandbox.workdir


def test_stdin_is_closed(calc_sandbox):
    start = time.monotonic()
    result = calc_sandbox.exec("cat; read x; echo done", timeout=20)
    assert result.output.strip() == "done"
    assert time.monotonic() - start < 10


def test_timeout_kills_the_whole_tree_and_keeps_partial_output(calc_sandbox):
    marker = f"pgsleep{os.getpid()}"
    result = calc_sandbox.exec(
        f"echo started; (exec -a {marker} sleep 300) & (bash -c 'exec -a {marker} sleep 300' &); sleep 300",
        timeout=1.5)
    assert result.timed_out and result.exit_code != 0
    assert "started" in result.output and "timed out" in result.output
    assert result.duration < 10
    time.sleep(0.2)
    ps = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert ps.stdout.strip() == "", "processes survived the timeout"


def test_a_command_that_closes_its_output_ends_when_it_exits(calc_sandbox):
    """Its exit status stands (coreutils close stdout before they exit, and were once killed in
    that gap), and its timeout still applies."""
    assert {calc_sandbox.exec("cat pyproject.toml > /dev/null; cat pyproject.toml").exit_code for _ in range(40)} == {0}
    quiet = calc_sandbox.exec("exec >&- 2>&-; sleep 0.3; exit 4", timeout=10)
    assert quiet.exit_code == 4 and not quiet.timed_out and quiet.duration >= 0.3, quiet
    stuck = calc_sandbox.exec("exec >&- 2>&-; sleep 30", timeout=1)
    assert stuck.timed_out and "timed out after 1s" in stuck.output and stuck.duration < 10, stuck
    noisy = calc_sandbox.exec("exec >&-; echo err >&2; sleep 30", timeout=1)
    assert noisy.timed_out and noisy.output.startswith("err") and "timed out" in noisy.output, noisy


def test_background_processes_do_not_outlive_the_command(calc_sandbox):
    start = time.monotonic()
    result = calc_sandbox.exec("(sleep 300 &) ; nohup sleep 300 >/dev/null 2>&1 & echo bg", timeout=30)
    assert result.output.strip() == "bg" and not result.timed_out
    assert time.monotonic() - start < 10


def test_output_is_capped_head_and_tail_with_a_marker(calc_sandbox):
    result = calc_sandbox.exec(
        "echo FIRST; head -c 100000000 /dev/zero | tr '\\0' x; echo; echo LAST", timeout=120,
        output_limit=10_000)
    assert result.exit_code == 0 and result.truncated
    assert result.output.startswith("FIRST")
    assert result.output.rstrip().endswith("LAST")
    assert "output truncated" in result.output and "100000" in result.output
    assert len(result.output) < 12_000


def test_workspace_has_no_history_after_base(calc_sandbox, calc_repo):
    _, info = calc_repo
    sb = calc_sandbox
    commits = sb.exec("git log --all --format=%H").output.split()
    assert commits[0] == info["base"] and len(commits) == 2
    assert sb.exec("git tag; git remote; git stash list").output.strip() == ""
    assert sb.exec("git for-each-ref --format='%(refname)'").output.split() == ["refs/heads/main"]
    assert sb.exec("git reflog --all 2>&1 | wc -l").output.strip() == "0"
    unreachable = sb.exec("git fsck --unreachable --dangling --no-reflogs 2>&1").output
    assert "unreachable" not in unreachable and "dangling" not in unreachable
    objects = sb.exec("git cat-file --batch-all-objects --batch-check | wc -l").output.strip()
    reachable = sb.exec("git rev-list --objects --all | wc -l").output.strip()
    assert objects == reachable
    assert "the-future-commit" not in sb.exec(
        "git cat-file --batch-all-objects --batch 2>/dev/null; cat .git/packed-refs .git/FETCH_HEAD 2>/dev/null").output


def test_read_write_diff_and_reset(calc_sandbox, calc_repo):
    sb = calc_sandbox
    sb.write_file("calc/extra.py", "X = 1\n")
    sb.write_file(f"{sb.workdir}/calc/__init__.py", "# emptied\n")
    assert sb.read_file("calc/extra.py") == b"X = 1\n"
    diff = sb.diff()
    assert "new file mode" in diff and "calc/extra.py" in diff and "+# emptied" in diff
    assert sb.exec("git status --porcelain").output.count("\n") == 2, "diff() must not touch the index"
    sb.exec("rm -rf ./* .git; echo junk > /tmp/leftover")
    sb.reset()
    assert sb.diff() == ""
    assert sb.exec("git rev-parse HEAD").output.strip() == calc_repo[1]["base"]
    assert sb.exec("cat /tmp/leftover 2>&1").exit_code != 0


def test_paths_outside_the_workspace_are_refused(calc_sandbox):
    sb = calc_sandbox
    for bad in ("../outside.txt", "/etc/passwd", "calc/../../x"):
        with pytest.raises(PathOutsideWorkspaceError):
            sb.read_file(bad)
    sb.exec("ln -s /etc/hostname link; ln -s .. updir")
    with pytest.raises(PathOutsideWorkspaceError):
        sb.read_file("link")
    with pytest.raises(PathOutsideWorkspaceError):
        sb.write_file("updir/escape.txt", "x")
    with pytest.raises(PathOutsideWorkspaceError):
        sb.exec("true", cwd="/")
    sb.exec("mkfifo pipe")
    start = time.monotonic()
    with pytest.raises(OSError, match="not a regular file"):
        sb.read_file("pipe")
    with pytest.raises(OSError, match="not a regular file"):
        sb.write_file("pipe", "x")
    assert time.monotonic() - start < 5


def test_close_is_idempotent_and_frees_everything(calc_task):
    from patchgym.tasks.backends import make_sandbox

    sb = make_sandbox(calc_task)
    root = sb.root
    cgroups = list(sb._group.dirs.values()) if sb._group else []
    assert root.exists()
    sb.close()
    sb.close()
    assert not root.exists()
    assert all(not p.exists() for p in cgroups)
    with pytest.raises(SandboxClosedError):
        sb.exec("true")


def test_bad_base_commit_is_an_infrastructure_error(calc_task):
    from patchgym.tasks.backends import sandbox_spec

    spec = sandbox_spec(calc_task)
    with pytest.raises(SandboxError, match="not in repository"):
        LocalSandbox(type(spec)(spec.repo, "f" * 40, spec.environment))


@needs_bwrap
def test_isolation_no_network_even_to_host_loopback(calc_sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    try:
        probe = ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', %d), timeout=3); print('CONNECTED')\n"
                 "except OSError as e:\n    print('refused', e)\n") % port
        calc_sandbox.write_file("probe.py", probe)
        result = calc_sandbox.exec("python probe.py; cat /sys/class/net/*/operstate 2>/dev/null | sort -u")
        assert "refused" in result.output and "CONNECTED" not in result.output
        assert not accepted
    finally:
        server.close()


@needs_bwrap
def test_isolation_host_is_read_only_and_secrets_are_hidden(calc_sandbox, calc_tasks_file, tmp_path):
    import patchgym.tasks as bundled

    secret = tmp_path / "host-secret.txt"
    secret.write_text("s3cret")
    sb = calc_sandbox
    result = sb.exec(
        f"touch /usr/pg-probe 2>&1; touch /etc/pg-probe 2>&1; cat {secret} 2>&1; "
        f"ls /root 2>&1; cat /etc/shadow 2>&1; cat {calc_tasks_file} 2>&1; ls {bundled.INSTANCES_DIR} 2>&1; "
        "echo ok > /tmp/private && cat /tmp/private; touch inside && echo wrote-workspace"
    )
    out = result.output
    assert out.count("Read-only file system") >= 2
    assert "s3cret" not in out
    assert "root:" not in out  # /etc/shadow is not there
    assert "def test_mean_empty" not in out and "FAIL_TO_PASS" not in out
    assert "No such file or directory" in out
    assert "wrote-workspace" in out and "ok" in out
    assert not Path("/usr/pg-probe").exists() and not Path("/etc/pg-probe").exists()
    assert not Path("/tmp/private").exists()


@needs_bwrap
def test_isolation_hides_the_interpreters_own_site_packages(calc_sandbox):
    """patchgym installed into the base interpreter brings its catalog (gold patches) along."""
    import sys
    import sysconfig

    base = sysconfig.get_path("purelib", vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    here = sysconfig.get_path("purelib")  # this interpreter's (a venv's, in a fresh checkout's venv)
    assert Path(base).is_dir() and any(Path(base).iterdir())
    out = calc_sandbox.exec(f"ls -A {base} {here} 2>/dev/null | grep -v ':$' | grep -c . ; "
                            "python -c 'import patchgym' 2>&1 | tail -1").output
    assert out.split()[0] == "0"
    assert "No module named 'patchgym'" in out


@needs_bwrap
def test_isolation_hides_other_processes(calc_sandbox):
    out = calc_sandbox.exec("ls /proc | grep -E '^[0-9]+$' | wc -l").output.strip()
    assert int(out) < 10


def _cgroups_active(sb) -> bool:
    return sb._group is not None and sb._group.active


def test_process_limit_is_enforced_before_any_fork_bomb(calc_task):
    """Proves the pids bound with harmless sleeps; only then runs a real fork bomb."""
    from patchgym.tasks.backends import make_sandbox

    sb = make_sandbox(calc_task, limits=ResourceLimits(max_processes=40))
    try:
        if not _cgroups_active(sb):
            pytest.skip("no pids cgroup here (not root?); a fork bomb would not be bounded")
        proof = sb.exec("for i in $(seq 80); do sleep 30 & done 2>&1; jobs -p | wc -l; "
                        "ls /sys/fs/cgroup >/dev/null; kill %% 2>/dev/null; true", timeout=20)
        assert "Resource temporarily unavailable" in proof.output or "fork" in proof.output.lower(), proof.output
        start = time.monotonic()
        bomb = sb.exec(":(){ :|:& };:; sleep 2; echo survived", timeout=8)
        assert time.monotonic() - start < 20
        assert not sb.command_pids(), "fork bomb processes survived"
        assert sb.exec("echo still-usable").output.strip() == "still-usable"
        del bomb
    finally:
        sb.close()


def test_exec_reports_the_cpu_its_processes_used(calc_sandbox):
    """CPU of the whole tree, background children included; a sleep costs next to none."""
    if not _cgroups_active(calc_sandbox):
        pytest.skip("no CPU accounting cgroup here (not root?)")
    burn = "python -c 'import time; t = time.process_time(); exec(\"while time.process_time() - t < 0.3: pass\")'"
    busy = calc_sandbox.exec(f"{burn} & {burn}; wait")
    assert busy.ok and busy.cpu_seconds is not None and busy.cpu_seconds >= 0.55, busy
    idle = calc_sandbox.exec("sleep 0.3")
    assert idle.cpu_seconds is not None and idle.cpu_seconds < 0.1, idle
    assert calc_sandbox._group.peak_memory_bytes() > 0


def test_memory_limit_kills_a_runaway_allocation(calc_task):
    from patchgym.tasks.backends import make_sandbox

    sb = make_sandbox(calc_task, limits=ResourceLimits(memory_bytes=256 << 20))
    try:
        result = sb.exec("python -c \"x = bytearray(1 << 30); print('allocated')\"", timeout=60)
        assert "allocated" not in result.output
        assert result.exit_code != 0
    finally:
        sb.close()


def test_file_size_limit(calc_task):
    from patchgym.tasks.backends import make_sandbox

    sb = make_sandbox(calc_task, limits=ResourceLimits(file_size_bytes=1 << 20))
    try:
        result = sb.exec("head -c 5000000 /dev/zero > big.bin; echo rc=$?; stat -c %s big.bin")
        assert "rc=0" not in result.output
        assert result.output.strip().endswith(str(1 << 20))
    finally:
        sb.close()


def test_unisolated_fallback_warns_and_still_works(calc_task, caplog, monkeypatch):
    import patchgym.sandboxes.local as local
    from patchgym.tasks.backends import make_sandbox

    monkeypatch.setattr(local, "_warned_unisolated", False)
    monkeypatch.setattr(local, "bwrap_path", lambda: None)
    with caplog.at_level("WARNING"):
        sb = make_sandbox(calc_task, isolation="auto")
    try:
        assert not sb.isolated
        assert "WITHOUT network or filesystem isolation" in caplog.text
        result = sb.exec("python -m pytest -q -p no:cacheprovider tests 2>&1 | tail -1")
        assert "7 passed" in result.output
        sb.write_file("calc/new.py", "X = 1\n")
        assert "calc/new.py" in sb.diff()
    finally:
        sb.close()
    with pytest.raises(SandboxError, match="bubblewrap isolation was required"):
        make_sandbox(calc_task, isolation="bwrap")


def test_reaper_removes_leftovers_of_dead_processes(calc_task, tmp_path):
    """A sandbox owned by a process that died (kill -9) is found and removed."""
    from patchgym.sandboxes import reap_stale
    from patchgym.sandboxes.paths import cache_dir

    pid, root = sandbox_of_a_killed_process(calc_task, "print(os.getpid(), sb.root)")
    leftover = Path(root)
    assert leftover.is_dir() and leftover.name.startswith(f"{pid}-")
    cgroups = list(Path("/sys/fs/cgroup/pids/patchgym").glob(f"sb-{pid}-*"))
    cgroups += list(Path("/sys/fs/cgroup/cpu").glob(f"patchgym-sb-{pid}-*"))  # v1 cpu: at the top
    assert reap_stale() >= 1
    assert not leftover.exists()
    assert leftover.parent == cache_dir("sandboxes")
    assert all(not p.exists() for p in cgroups)


@needs_bwrap
def test_bubblewrap_failures_are_infrastructure_not_the_commands(calc_sandbox):
    fake = calc_sandbox.exec("echo 'bwrap: Operation not permitted' >&2; exit 1")
    assert fake.exit_code == 1, "a command imitating bubblewrap is still the command's result"
    calc_sandbox._bwrap_prefix = calc_sandbox._bwrap_prefix + ["--bind", "/nonexistent-patchgym", "/x"]
    calc_sandbox.reset()  # the sandbox's init process starts again, now with a broken mount
    with pytest.raises(SandboxError, match="bubblewrap could not start the sandbox"):
        calc_sandbox.exec("echo hi")


@needs_bwrap
def test_commands_cannot_kill_trace_or_outlive_the_sandbox_init(calc_sandbox):
    """One long-lived init process per sandbox runs the commands: a command can neither signal it
    (pid 1 of the namespace), read its memory or file descriptors (non-dumpable), nor leave a
    process behind it (double-forked, setsid, or ignoring signals)."""
    calc_sandbox.exec("true")
    init = calc_sandbox._init.pid
    attack = calc_sandbox.exec(
        "kill -9 1; kill -STOP 1; kill -9 -1; "
        "cat /proc/1/environ >/dev/null && echo READ-ENVIRON; "
        "echo '{\"exit_code\": 0, \"output\": \"forged\"}' > /proc/1/fd/1 && echo WROTE-ITS-OUTPUT; "
        "head -c1 /proc/1/fd/0 >/dev/null && echo READ-ITS-INPUT; head -c1 /proc/1/mem >/dev/null && echo READ-MEM; "
        "(setsid sh -c 'trap \"\" TERM HUP; sleep 300' &) ; (nohup sleep 301 >/dev/null 2>&1 &); echo done")
    assert "READ-" not in attack.output and "WROTE-" not in attack.output, attack.output
    assert attack.output.strip().endswith("done") and attack.exit_code == 0, attack.output
    assert calc_sandbox._init.pid == init, "the init process was replaced"
    assert not calc_sandbox.command_pids(), "a process outlived its command"
    after = calc_sandbox.exec("grep -l 'slee[p] 30' /proc/[0-9]*/cmdline; echo checked")
    assert after.output.strip() == "checked", after.output


@needs_bwrap
def test_an_idle_sandbox_holds_a_compiled_init_where_a_c_compiler_is(calc_sandbox):
    """Where the host has a C compiler (CI installs one), the init is the compiled sandbox_init.c:
    it holds well under a MiB of its own when idle, where the Python init held about 8.5."""
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: sandboxes run the Python init (test_backends covers it)")
    calc_sandbox.exec("true")
    init = next(iter(calc_sandbox._init.pids() - {calc_sandbox._init.pid}))
    assert Path(f"/proc/{init}/comm").read_text().strip() == "sandbox_init"
    rollup = dict(line.split(":", 1) for line in Path(f"/proc/{init}/smaps_rollup").read_text().splitlines()[1:])
    private_kib = sum(int(rollup[key].split()[0]) for key in ("Private_Clean", "Private_Dirty"))
    assert private_kib < 2048, f"the idle init holds {private_kib} KiB of its own"


@needs_bwrap
def test_shared_memory_and_ipc_objects_do_not_outlive_the_command(calc_sandbox):
    """What a command can leave without a process (POSIX shm files, System V segments and queues)
    is gone before the next command, as it was when every command had namespaces of its own."""
    left = calc_sandbox.exec("head -c 100000 /dev/zero > /dev/shm/stash && ipcmk -M 65536 && ipcmk -Q && ipcs")
    assert left.ok and "0x" in left.output, left.output
    after = calc_sandbox.exec("ls -A /dev/shm; ipcs -m | grep -c 0x; ipcs -q | grep -c 0x")
    assert after.output.split() == ["0", "0"], after.output


def test_close_from_another_thread_ends_a_running_command_at_once(calc_task):
    from patchgym.tasks.backends import make_sandbox

    sb = make_sandbox(calc_task)
    sb.exec("true")
    outcome = {}

    def run():
        try:
            outcome["result"] = sb.exec("sleep 60", timeout=120)
        except SandboxError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)
    start = time.monotonic()
    sb.close()
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - start < 15
    assert isinstance(outcome.get("error"), SandboxClosedError) or not outcome["result"].ok, outcome


@needs_bwrap
def test_an_init_process_killed_from_outside_is_an_infrastructure_error_until_a_reset(calc_sandbox):
    """The workspace lives in the init's mount namespace (the host's mount table does not grow with
    the sandboxes): an init killed from outside takes the agent's work with it, so every call says
    so (an infrastructure error, never a silently pristine tree) until a reset makes a new one."""
    calc_sandbox.exec("echo kept > kept.txt")
    calc_sandbox._group.kill_all()
    with pytest.raises(SandboxError, match="init process died"):
        calc_sandbox.exec("true")
    for call in (lambda: calc_sandbox.exec("cat kept.txt"), calc_sandbox.diff, lambda: calc_sandbox.read_file("x")):
        with pytest.raises(SandboxError, match="lost its workspace"):
            call()
    calc_sandbox.reset()
    assert calc_sandbox.exec("ls kept.txt").exit_code != 0 and calc_sandbox.diff() == ""



def test_an_init_killed_by_the_sandboxs_memory_limit_is_the_agents_failure_until_a_reset(calc_sandbox, monkeypatch):
    """A command may raise the init's oom_score_adj, so an init the sandbox's memory limit killed
    (taking the workspace in its namespace with it) is the agent's doing: what follows is its
    failure (a command's output, an editor error, a diff the grader scores 0), never a masked
    infrastructure error that would hide the episode's 0."""
    from patchgym.sandboxes.base import WorkspaceError

    calc_sandbox.exec("echo kept > kept.txt")
    monkeypatch.setattr(calc_sandbox._group, "oom_kills", lambda: 10**6)  # as the cgroup counts an OOM kill
    calc_sandbox._group.kill_all()
    assert "out of memory" in calc_sandbox.exec("true").output
    again = calc_sandbox.exec("cat kept.txt")
    assert again.exit_code != 0 and "lost its workspace" in again.output
    with pytest.raises(WorkspaceError, match="out of memory"):
        calc_sandbox.diff()
    with pytest.raises(OSError, match="out of memory"):
        calc_sandbox.read_file("kept.txt")
    monkeypatch.undo()
    calc_sandbox.reset()
    assert calc_sandbox.exec("ls kept.txt").exit_code != 0 and calc_sandbox.diff() == ""

def test_a_sandbox_weighs_as_one_process_in_a_cpu_cgroup_of_its_own(calc_task):
    """Each local sandbox's processes share one cpu cgroup (a weight and a quota, as a Docker
    container's): 100 busy processes get one sandbox's share, not 100 processes' worth. The
    latency figures are bench/cpu_share.py's."""
    from patchgym.tasks.backends import make_sandbox

    sb = make_sandbox(calc_task, limits=ResourceLimits(cpus=0.5))
    try:
        if "cpu" not in sb._group.dirs:
            pytest.skip("no cpu cgroup here (not root, or no cpu controller)")
        cpu = sb._group.dirs["cpu"]
        quota = {f: (cpu / f).read_text().strip() for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us")} \
            if (cpu / "cpu.cfs_quota_us").exists() else {"cpu.max": (cpu / "cpu.max").read_text().strip()}
        assert quota in ({"cpu.cfs_quota_us": "50000", "cpu.cfs_period_us": "100000"}, {"cpu.max": "50000 100000"})
        seen: list[set[int]] = []

        def look() -> None:  # while a command runs: every process of the sandbox is in its cpu cgroup
            time.sleep(0.4)
            seen.append(set(map(int, (cpu / "cgroup.procs").read_text().split())))
            seen.append(set(map(int, (sb._group.dirs["pids"] / "cgroup.procs").read_text().split())))

        looker = threading.Thread(target=look)
        looker.start()
        assert sb.exec("sleep 1", timeout=10).exit_code == 0
        looker.join()
        assert seen[0] == seen[1] and len(seen[0]) >= 2, seen  # its init process and the command
    finally:
        sb.close()
    assert not cpu.exists()
