"""Crash safety: whatever patchgym starts dies with it, also on SIGKILL, and a build killed
half-way is never reused nor removed under an orphan still writing into it (issue 22)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from patchgym.sandboxes.base import EnvironmentSpec
from patchgym.sandboxes.environments import ensure_environment, ready_venv
from patchgym.sandboxes.lifetime import ORPHANED_EXIT, parent_checked, run_checked, setpriv_path
from patchgym.sandboxes.process import is_dead_or_exiting

ROOT = Path(__file__).resolve().parents[1]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
pytestmark = pytest.mark.skipif(setpriv_path() is None, reason="setpriv (util-linux) is not installed")

BUILDER = """
import sys
from patchgym.sandboxes.environments import ensure_environment
from patchgym.sandboxes.base import EnvironmentSpec
ensure_environment(EnvironmentSpec(python=sys.argv[1], pre_install=(sys.argv[2],)))
"""


def _tag() -> str:
    """A sleep length no other process on the host has in its command line."""
    return f"{3000 + int.from_bytes(os.urandom(2), 'big')}.{os.getpid()}"


def _alive(needle: str) -> list[int]:
    """Live processes whose command line contains ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline and not is_dead_or_exiting(int(entry.name)):
            found.append(int(entry.name))
    return found


def _gone_soon(needle: str, within: float = 15.0) -> bool:
    """Whether every process with ``needle`` ends within ``within`` s (a bound on the kernel's
    delivery of a death signal on a loaded host, not a measurement)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _alive(needle):
            return True
        time.sleep(0.1)
    return False


def _wait_for(path: Path, proc: subprocess.Popen, within: float = 120.0) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        assert proc.poll() is None, f"the starter ended first ({proc.returncode}): {proc.stderr and proc.stderr.read()}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _start(code: str, *args: str, home: Path) -> subprocess.Popen:
    env = {**os.environ, "PATCHGYM_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_a_child_whose_starter_died_before_it_was_tied_to_it_does_not_run(tmp_path):
    """The fork -> prctl window: the child finds it is no longer its starter's, and exits 125."""
    flag = tmp_path / "ran"
    proc = subprocess.run(parent_checked(["touch", str(flag)], starter=1))  # pid 1 is not our parent
    assert proc.returncode == ORPHANED_EXIT and not flag.exists()
    proc = subprocess.run(parent_checked(["sh", "-c", f"touch {flag}; exit 3"]))
    assert proc.returncode == 3 and flag.exists()


def test_a_build_step_and_what_it_left_in_the_background_are_killed_on_timeout():
    tag = _tag()
    with pytest.raises(subprocess.TimeoutExpired):
        run_checked(["sh", "-c", f"sleep {tag} & sleep {tag}"], timeout=1)
    assert _gone_soon(tag)
    proc = run_checked(["sh", "-c", "read line; echo \"got $line\"; exit 4"], input=b"x\n",
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert (proc.returncode, proc.stdout) == (4, b"got x\n")


def test_sigkilling_a_build_kills_its_installers(tmp_path, monkeypatch):
    """SIGKILL the process that builds an environment while its step (and a child of that step)
    runs: nothing it started is alive a moment later."""
    home, started, tag = tmp_path / "home", tmp_path / "started", _tag()
    step = f"touch {started}; sleep {tag} & sleep {tag}"
    builder = _start(BUILDER, PYTHON, step, home=home)
    try:
        _wait_for(started, builder)
        assert len(_alive(tag)) >= 2
    finally:
        _kill(builder)
    assert _gone_soon(tag), f"still running after the builder was killed: {_alive(tag)}"


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_sigkilling_a_sandbox_starter_ends_the_sandbox(isolation, tmp_path, calc_repo):
    """A local sandbox (bubblewrap and its init, or a plain command without them) and the command
    it runs die with the process that made it."""
    import json

    from conftest import calc_task_row

    repo, info = calc_repo
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps(calc_task_row(repo, info)) + "\n")
    tag = _tag()
    code = f"""
from patchgym import load_tasks
from patchgym.tasks.backends import make_sandbox
sandbox = make_sandbox(load_tasks({str(tasks)!r})[0], "local", isolation={isolation!r})
sandbox.exec("sleep {tag}", timeout=900)
"""
    starter = _start(code, home=Path(os.environ["PATCHGYM_HOME"]))
    try:
        deadline = time.monotonic() + 120
        while not _alive(tag):
            assert starter.poll() is None, starter.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the sandbox's command never started"
            time.sleep(0.1)
    finally:
        _kill(starter)
    assert _gone_soon(tag), f"still running after the starter was killed: {_alive(tag)}"


def test_a_half_built_environment_is_rebuilt_not_reused_nor_removed_under_an_orphan(tmp_path, monkeypatch):
    """The issue's ``OSError: [Errno 39] Directory not empty: 'site-packages'``: a build is
    SIGKILLed while something it started (here one that left its process group) still writes
    into the venv; the next build must neither reuse that venv nor race the orphan removing it."""
    home = tmp_path / "home"
    monkeypatch.setenv("PATCHGYM_HOME", str(home))
    started, release, resumed = tmp_path / "started", tmp_path / "release", tmp_path / "resumed"
    # The orphan ends when released, and on its own after 5 minutes whatever happens to this test.
    orphan = (f"setsid sh -c 'end=$(($(date +%s) + 300)); while [ ! -e {release} ] && [ $(date +%s) -lt $end ]; "
              f"do mkdir -p \"$VIRTUAL_ENV/lib/x/d$$\"; "
              f"touch \"$VIRTUAL_ENV/lib/x/d$$/f$(date +%N)\"; done' </dev/null >/dev/null 2>&1 &")
    step = f"[ -e {resumed} ] && exit 0; {orphan} touch {started}; sleep 600"
    spec = EnvironmentSpec(python=PYTHON, pre_install=(step,))
    builder = _start(BUILDER, PYTHON, step, home=home)
    try:
        try:
            _wait_for(started, builder)
        finally:
            _kill(builder)
        [entry] = [p for p in (home / "envs").iterdir() if p.is_dir()]
        assert ready_venv(entry) is None, "a killed build must not look complete"
        # The orphan inherited the entry's lock: nobody may remove its attempt while it writes.
        fd = os.open(entry.with_suffix(".lock"), os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        [half] = [p for p in entry.iterdir() if p.is_dir()]
        resumed.touch()
    finally:
        release.touch()  # the orphan ends; the next build waits for that, then starts afresh
    built = ensure_environment(spec)
    assert built.venv.parent != half and (built.venv / "bin" / "python").exists()
    assert ready_venv(entry) == built.venv
    assert not half.exists(), "the dead attempt is removed once its builder is provably gone"
    assert ensure_environment(spec).venv == built.venv  # and the complete one is reused


# -- Docker: builds coordinated through the engine --------------------------------------------------

RUNTIME = """
from patchgym.sandboxes.docker.runtime import runtime_volume
print(runtime_volume())
"""


@pytest.fixture
def namespace(docker_base, monkeypatch):
    """A fresh ``PATCHGYM_DOCKER_NAMESPACE``; what the test made in it is removed after it."""
    from patchgym.sandboxes.docker.build_mutex import BUILD_PREFIX
    from patchgym.sandboxes.docker.client import docker_client

    ns = f"t{os.urandom(4).hex()}"
    monkeypatch.setenv("PATCHGYM_DOCKER_NAMESPACE", ns)
    yield ns
    client = docker_client()
    for container in client.containers.list(all=True, filters={"name": f"{BUILD_PREFIX}{ns}-"}):
        container.remove(force=True)
    for volume in client.volumes.list(filters={"name": f"patchgym-runtime-{ns}-"}):
        volume.remove(force=True)


def _runtime_names(ns: str) -> tuple[str, str]:
    from patchgym.sandboxes.docker.build_mutex import build_name
    from patchgym.sandboxes.docker.runtime import VOLUME_PREFIX, runtime_key

    key = runtime_key()
    return VOLUME_PREFIX + f"{ns}-" + key, build_name(f"runtime-{key}")


def _server_in(volume: str) -> str:
    from patchgym.sandboxes.docker.client import docker_client
    from patchgym.sandboxes.docker.images import base_tag

    return docker_client().containers.run(
        base_tag(), ["sh", "-c", "test -x /v/pgserver && test -f /v/diff_helper.py && ls /v"], remove=True,
        network_mode="none", volumes={volume: {"bind": "/v", "mode": "ro"}}).decode()


def test_two_homes_racing_on_a_fresh_engine_build_the_runtime_once(tmp_path, namespace):
    """Two processes with different homes (no file lock in common) ask for the runtime volume at
    once: both get it whole, and no build container is left."""
    from patchgym.sandboxes.docker.client import docker_client

    volume, build = _runtime_names(namespace)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    racers = [subprocess.Popen([sys.executable, "-c", RUNTIME], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**env, "PATCHGYM_HOME": str(tmp_path / f"home{i}")})
              for i in range(2)]
    outputs = [racer.communicate(timeout=600) for racer in racers]
    assert [r.returncode for r in racers] == [0, 0], [o[1].decode()[-2000:] for o in outputs]
    assert {o[0].decode().strip() for o in outputs} == {volume}
    assert "pgserver" in _server_in(volume)
    assert not docker_client().containers.list(all=True, filters={"name": build})


def test_a_dead_builders_container_and_half_filled_volume_are_taken_over(namespace):
    """A builder SIGKILLed mid-build leaves its build container (the mutex) and a volume without
    its completion marker: the next builder removes the container, since its owner is provably
    gone, and fills the volume again in place."""
    from patchgym.sandboxes.docker.build_mutex import STARTED_LABEL
    from patchgym.sandboxes.docker.client import KIND_LABEL, MANAGED_LABEL, OWNER_LABEL, docker_client
    from patchgym.sandboxes.docker.images import base_tag
    from patchgym.sandboxes.docker.runtime import runtime_volume

    volume, build = _runtime_names(namespace)
    dead = subprocess.Popen(["true"])
    dead.wait()
    client = docker_client()
    client.volumes.create(name=volume)  # half-filled: exists, no marker
    client.containers.create(base_tag(), ["sleep", "infinity"], name=build, labels={
        MANAGED_LABEL: "1", KIND_LABEL: "build", OWNER_LABEL: f"{os.uname().nodename}:{dead.pid}",
        STARTED_LABEL: "1"}).start()
    assert runtime_volume() == volume
    assert "pgserver" in _server_in(volume)
    assert not client.containers.list(all=True, filters={"name": build})


def test_a_build_held_by_a_live_owner_is_waited_for_not_taken(namespace):
    from patchgym.sandboxes import EnvironmentBuildError
    from patchgym.sandboxes.docker.build_mutex import build_name, claim, owner_labels
    from patchgym.sandboxes.docker.client import KIND_LABEL, MANAGED_LABEL, docker_client
    from patchgym.sandboxes.docker.images import base_tag

    client = docker_client()

    def create(name: str):
        return client.containers.create(base_tag(), ["true"], name=name,
                                        labels={MANAGED_LABEL: "1", KIND_LABEL: "build", **owner_labels()})

    held = claim(build_name("held"), create)
    try:
        with pytest.raises(EnvironmentBuildError, match="still held by"):
            claim(build_name("held"), create, poll=0.1, timeout=0.5)
    finally:
        held.remove(force=True)
    claim(build_name("held"), create).remove(force=True)  # free again once released


IMAGE_BUILDER = """
import sys
from patchgym.sandboxes.docker.images import environment_image
from patchgym.sandboxes.base import EnvironmentSpec
environment_image(EnvironmentSpec(python=sys.argv[1], pre_install=(sys.argv[2],)))
"""
# The runtime's build, its step held up (it takes a second or two) until the builder is killed.
RUNTIME_BUILDER = """
import sys
from patchgym.sandboxes.docker import images, runtime
run = images.BuildContainer.run
images.BuildContainer.run = lambda box, argv, **kw: run(box, ["sh", "-c", sys.argv[1] + " && " + argv[-1]], **kw)
runtime.runtime_volume()
"""


def _commands(container) -> str:
    """The command lines running in ``container`` ("" once it is gone or stopped)."""
    import docker.errors

    try:
        return "\n".join(p[-1] for p in container.top()["Processes"])
    except docker.errors.APIError:
        return ""


def _kill_mid_step(code: str, *args: str, step: str, namespace: str, home: Path) -> None:
    """Start ``code`` with ``args``, SIGKILL it once ``step`` runs in a build container of
    ``namespace``, and check that the engine removes that container within seconds: no wait for
    gc or for the next claimant of the build."""
    from patchgym.sandboxes.docker.build_mutex import BUILD_PREFIX
    from patchgym.sandboxes.docker.client import docker_client

    client = docker_client()
    builds = {"name": f"{BUILD_PREFIX}{namespace}-"}
    builder = _start(code, *args, home=home)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert builder.poll() is None, builder.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the build never reached its step"
            if any(step in _commands(c) for c in client.containers.list(filters=builds)):
                break
            time.sleep(0.2)
    finally:
        _kill(builder)
    deadline = time.monotonic() + 15
    while client.containers.list(all=True, ignore_removed=True, filters=builds) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not client.containers.list(all=True, ignore_removed=True, filters=builds)


def test_sigkilling_an_image_builder_removes_its_build_container(tmp_path, namespace, docker_base):
    """An environment image's builder SIGKILLed while a step runs: its build container goes, the
    step with it, and no image is left, tagged or half-built."""
    from patchgym.sandboxes.docker.client import docker_client
    from patchgym.sandboxes.docker.images import PYTHON_LABEL, _image, environment_key, python_source

    client = docker_client()
    python = ".".join(client.images.get(docker_base).labels[PYTHON_LABEL].split(".")[:2])
    step = f"sleep {_tag()}"
    spec = EnvironmentSpec(python=python, pre_install=(step,))
    tag = f"patchgym/env:{environment_key(spec, client.images.get(docker_base).id, python_source(spec))}"
    _kill_mid_step(IMAGE_BUILDER, python, step, step=step, namespace=namespace, home=tmp_path / "home")
    assert _image(tag) is None


def test_sigkilling_the_runtimes_builder_removes_its_build_container(tmp_path, namespace):
    """The runtime volume's builder SIGKILLed while its build runs: its build container goes, and
    the volume is not marked complete (the next builder fills it again)."""
    from patchgym.sandboxes.docker.runtime import COMPLETE_SUFFIX, _complete

    volume, _ = _runtime_names(namespace)
    step = f"sleep {_tag()}"
    _kill_mid_step(RUNTIME_BUILDER, step, step=step, namespace=namespace, home=tmp_path / "home")
    assert not _complete(volume), f"{volume}{COMPLETE_SUFFIX} exists"


def test_gc_removes_unfinished_attempts_only_while_nobody_builds(tmp_path, monkeypatch):
    import json

    from patchgym.sandboxes.environments import reap_attempts
    from patchgym.sandboxes.locks import file_lock

    monkeypatch.setenv("PATCHGYM_HOME", str(tmp_path / "home"))
    root = tmp_path / "home" / "envs" / "0123456789abcdef"
    (root / "attempt-1-aa" / "venv").mkdir(parents=True)
    (root / "attempt-2-bb" / "venv" / "lib").mkdir(parents=True)
    (root / "ready.json").write_text(json.dumps({"attempt": "attempt-1-aa"}))
    with file_lock(root.with_suffix(".lock")):  # a build (or its orphan) holds the entry
        assert reap_attempts() == 0 and (root / "attempt-2-bb").exists()
    assert reap_attempts() == 1
    assert sorted(p.name for p in root.iterdir()) == ["attempt-1-aa", "ready.json"]
    assert ready_venv(root) == root / "attempt-1-aa" / "venv"


def test_gc_removes_half_made_cache_entries_of_dead_makers_only(tmp_path, monkeypatch):
    """A checkout, a mirror, the shared /etc copy or uv's downloads listing is made under a staging
    name and renamed into place: one whose maker was SIGKILLed is removed by gc; a live maker's (this process's) and the
    finished entries are kept."""
    from patchgym.sandboxes.cleanup import reap_stale
    from patchgym.sandboxes.paths import cache_dir
    from patchgym.sandboxes.reaper import staging_path

    home = tmp_path / "home"
    monkeypatch.setenv("PATCHGYM_HOME", str(home))
    maker = _start("import os, sys\nfrom pathlib import Path\nfrom patchgym.sandboxes.reaper import staging_path\n"
                   "from patchgym.sandboxes.paths import cache_dir\n"
                   "for kind, name in (('checkouts', 'ab-0123'), ('mirrors', 'ab.git'), ('etc-shared', 'k')):\n"
                   "    half = staging_path(cache_dir(kind) / name)\n"
                   "    (half / 'sub').mkdir(parents=True)\n"
                   "    (half / 'sub' / 'f').write_text('x')\n"
                   "staging_path(cache_dir('python') / 'downloads-0.json').write_text('{}')\n"
                   "os.kill(os.getpid(), 9)\n", home=home)
    maker.wait(timeout=60)
    assert maker.returncode == -9, maker.stderr.read().decode()[-2000:]
    dead = [p for kind in ("checkouts", "mirrors", "etc-shared", "python") for p in cache_dir(kind).iterdir()]
    assert len(dead) == 4 and all(p.name.startswith(".") for p in dead)
    live = staging_path(cache_dir("checkouts") / "cd-4567")
    live.mkdir()
    done = cache_dir("checkouts") / "ab-0123"
    done.mkdir()
    assert reap_stale() >= 4
    assert not any(p.exists() for p in dead)
    assert live.is_dir() and done.is_dir()


def test_gc_keeps_an_environment_of_the_layout_before_attempts(tmp_path, monkeypatch):
    from patchgym.sandboxes.environments import reap_attempts

    monkeypatch.setenv("PATCHGYM_HOME", str(tmp_path / "home"))
    root = tmp_path / "home" / "envs" / "fedcba9876543210"
    (root / "venv" / "bin").mkdir(parents=True)
    (root / "build.log").write_text("")
    (root / "ready.json").write_text("{}")
    assert reap_attempts() == 0 and ready_venv(root) == root / "venv"


def test_a_sandbox_made_in_a_thread_that_ends_lives_on(tmp_path, calc_repo):
    """The death signal follows the thread that started a child: a sandbox made in a worker thread
    (a server's request thread) must not die when that thread ends, only with the process."""
    import json
    import threading

    from conftest import calc_task_row

    from patchgym import load_tasks
    from patchgym.tasks.backends import make_sandbox

    repo, info = calc_repo
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps(calc_task_row(repo, info)) + "\n")
    made: list = []
    worker = threading.Thread(target=lambda: made.append(make_sandbox(load_tasks(tasks)[0], "local")))
    worker.start()
    worker.join()
    [sandbox] = made
    try:
        time.sleep(0.2)  # (the thread's exit is done by now; a wrongly tied sandbox died with it)
        result = sandbox.exec("echo alive", timeout=60)
        assert (result.exit_code, result.output) == (0, "alive\n")
    finally:
        sandbox.close()
