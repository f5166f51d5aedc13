"""Docker images against the running engine: the debootstrapped base, environment and instance images,
and list/prune touching only what patchgym labelled.

Skipped without a Docker engine (failed instead when PATCHGYM_REQUIRE_DOCKER=1). The base image is
built once when missing (about a minute) and reused across sessions.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from patchgym.sandboxes import EnvironmentBuildError, EnvironmentSpec
from patchgym.sandboxes.docker.client import KIND_LABEL, MANAGED_LABEL


def test_each_environment_gets_a_release_whose_python_fits(monkeypatch):
    """No Docker needed: the choice reads the known releases and the base images' labels."""
    from patchgym.sandboxes.docker import images

    monkeypatch.setattr(images, "_base_pythons", lambda: {})
    monkeypatch.setattr(images, "DEFAULT_RELEASE", "bookworm")
    assert images.release_for(EnvironmentSpec(python=">=3.8")) == "bookworm", "the default when it fits"
    assert images.release_for(EnvironmentSpec(python="3.9")) == "bullseye"
    assert images.release_for(EnvironmentSpec(python="3.13")) == "trixie"
    assert images.release_for(EnvironmentSpec(python=">=3.12")) == "trixie"
    assert images.release_for(EnvironmentSpec(python="<3.11")) == "bullseye", "the oldest that fits"
    assert images.release_for(EnvironmentSpec(python="3.9"), "trixie") == "trixie", "as asked (checked later)"
    with pytest.raises(EnvironmentBuildError, match=r"satisfies '3.7'.*bootstrap one that does"):
        images.release_for(EnvironmentSpec(python="3.7"))
    monkeypatch.setattr(images, "_base_pythons", lambda: {"buster": "3.7.3"})
    assert images.release_for(EnvironmentSpec(python="3.7")) == "buster", "a base image bootstrapped by hand"


def test_a_base_image_with_other_packages_is_bootstrapped_again_from_its_mirror(monkeypatch):
    """No Docker needed: a base made before BASE_PACKAGES changed (no compiler) is rebuilt, from the
    mirror it came from (an Ubuntu base must not be rebuilt from the Debian mirror)."""
    from patchgym.sandboxes.docker import images

    class Image:
        def __init__(self, labels):
            self.labels, self.id = labels, "sha256:x"

    current = {images.PACKAGES_LABEL: ",".join(images.BASE_PACKAGES), images.MIRROR_LABEL: "http://m/ubuntu"}
    calls = []
    monkeypatch.setattr(images, "bootstrap_base", lambda release, **kw: calls.append((release, kw)))
    monkeypatch.setattr(images, "_image", lambda tag: Image(current))
    images.ensure_base("jammy")
    assert calls == []
    monkeypatch.setattr(images, "_image", lambda tag: Image({images.MIRROR_LABEL: "http://m/ubuntu"}))
    images.ensure_base("jammy")
    assert calls == [("jammy", {"mirror": "http://m/ubuntu", "force": True, "progress": None})]
    assert {"gcc", "python3-dev"} <= set(images.BASE_PACKAGES)


def test_ubuntu_releases_are_bootstrapped_with_universe(tmp_path, monkeypatch):
    """jammy (Python 3.10) failed: python3-venv is in Ubuntu's universe, not main."""
    from patchgym.sandboxes.docker import images

    (tmp_path / "gutsy").write_text("")
    (tmp_path / "sid").write_text("")
    (tmp_path / "jammy").symlink_to("gutsy")
    (tmp_path / "bullseye").symlink_to("sid")
    monkeypatch.setattr(images, "DEBOOTSTRAP_SCRIPTS", tmp_path)
    jammy = images.debootstrap_argv("jammy", Path("/r"), "http://m/ubuntu")
    assert "--components=main,universe" in jammy and jammy[-3:] == ["jammy", "/r", "http://m/ubuntu"]
    assert not any(a.startswith("--components") for a in images.debootstrap_argv("bullseye", Path("/r"), "http://m"))


def test_host_mirror_reads_deb822_and_one_line_sources(tmp_path):
    from patchgym.sandboxes.docker.images import DEFAULT_MIRROR, host_mirror

    assert host_mirror(apt_dir=tmp_path) == DEFAULT_MIRROR
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.internal/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\nTypes: deb deb-src\nURIs: http://mirror.internal/debian/\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n")
    assert host_mirror(apt_dir=tmp_path) == "http://mirror.internal/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("deb http://security.debian.org/debian-security bookworm-security main\n"
                                           "deb [arch=amd64] http://apt.example/debian bookworm main\n")
    assert host_mirror(apt_dir=tmp_path) == "http://apt.example/debian"


@pytest.fixture(scope="module")
def client(docker_base):  # skips (or fails under PATCHGYM_REQUIRE_DOCKER=1) without an engine
    from patchgym.sandboxes.docker.client import docker_client

    return docker_client()


def run(client, image: str, command: str) -> str:
    """Output of ``bash -c command`` in a throwaway container (no network)."""
    return client.containers.run(image, ["bash", "-c", command], remove=True, network_mode="none",
                                 labels={MANAGED_LABEL: "1", KIND_LABEL: "build"}).decode()


@pytest.fixture(scope="module")
def env_tag(client, calc_task):
    from patchgym.sandboxes.docker.images import environment_image

    return environment_image(calc_task.environment.to_spec())


@pytest.mark.slow
def test_base_image_labels_and_python(client, docker_base):
    assert docker_base == "patchgym/base:bookworm"
    image = client.images.get(docker_base)
    assert image.labels[MANAGED_LABEL] == "1" and image.labels[KIND_LABEL] == "base"
    assert image.attrs["Config"]["Cmd"] == ["bash"]
    assert "LANG=C.UTF-8" in image.attrs["Config"]["Env"]
    output = run(client, docker_base, "python3 -c 'import sys, venv, ensurepip; print(sys.version_info[:2])'; "
                                      "git --version; patch --version | head -1; ps -p 1 -o comm=; "
                                      "gcc --version | head -1; test -f /usr/include/python3.11/Python.h && echo headers")
    assert "(3, 11)" in output and "git version" in output and "GNU patch" in output
    assert "gcc" in output and "headers" in output, "a compiler and Python.h for packages without wheels"
    assert image.labels["org.patchgym.python"].startswith("3.11.")


@pytest.mark.slow
def test_base_image_trusts_the_hosts_cas(client, docker_base):
    host_bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if not host_bundle.is_file():
        pytest.skip("the host has no /etc/ssl/certs/ca-certificates.crt")
    inside = run(client, docker_base, "sha256sum /etc/ssl/certs/ca-certificates.crt").split()[0]
    assert inside == hashlib.sha256(host_bundle.read_bytes()).hexdigest()


@pytest.mark.slow
def test_environment_image_is_built_once_and_has_pytest(client, calc_task, env_tag):
    from patchgym.sandboxes.docker.images import environment_image

    assert env_tag.startswith("patchgym/env:") and len(env_tag.split(":")[1]) == 16
    image = client.images.get(env_tag)
    assert image.labels[KIND_LABEL] == "env" and image.labels[MANAGED_LABEL] == "1"
    assert "VIRTUAL_ENV=/opt/venv" in image.attrs["Config"]["Env"]

    messages: list[str] = []
    start = time.monotonic()
    again = environment_image(calc_task.environment.to_spec(), progress=messages.append)
    assert again == env_tag and messages == []  # progress reports only work actually done
    assert time.monotonic() - start < 10
    assert client.images.get(again).id == image.id

    output = run(client, env_tag, "command -v python; python -m pytest --version")
    assert output.startswith("/opt/venv/bin/python") and "pytest 8.3.5" in output
    # not the release's own pip (20.3 on bullseye, 23.0 on bookworm), which broke editable installs
    pip = run(client, env_tag, "python -m pip --version").split()[1]
    assert pip.startswith("24."), pip
    # build containers are always removed
    left = client.containers.list(all=True, ignore_removed=True, filters={"label": f"{KIND_LABEL}=build", "ancestor": image.id})
    assert not left, [(c.name, c.status, c.attrs["Config"]["Image"], c.attrs["Created"], c.labels) for c in left]


@pytest.mark.slow
def test_instance_image_has_no_history_after_base(client, calc_task, calc_repo, env_tag):
    from patchgym.sandboxes.docker.images import instance_image
    from patchgym.tasks.backends import sandbox_spec

    _, info = calc_repo
    spec = sandbox_spec(calc_task)
    tag = instance_image(spec.repo, spec.base_commit, spec.environment)
    assert tag.startswith("patchgym/instance:")
    image = client.images.get(tag)
    assert image.labels[KIND_LABEL] == "instance" and image.attrs["Config"]["WorkingDir"] == "/testbed"
    assert instance_image(spec.repo, spec.base_commit, spec.environment) == tag

    output = run(client, tag, "pwd; git rev-parse HEAD; git status --porcelain")
    assert output.split() == ["/testbed", info["base"]]  # at base, clean
    # compiled at build (a fresh grading sandbox must not compile the repository again), and ignored
    assert int(run(client, tag, "find /testbed -path '*/__pycache__/*.pyc' | grep -c calc; true")) > 0
    history = run(client, tag, "git log --all --format=%s; git tag; git reflog --all; git for-each-ref; "
                               f"git cat-file -t {info['fix_commit']} 2>&1; true")
    assert history.splitlines()[:2] == ["Add mean()", "Initial commit: clamp()"]
    assert "Release 0.2" not in history and "Fix mean" not in history and "v0.2" not in history
    assert "refs/heads/main" in history and "refs/tags" not in history
    tests = run(client, tag, "python -m pytest -q -p no:cacheprovider 2>&1 | tail -1")
    assert "7 passed" in tests
    # keyed by the session's temporary repository path: never reused, so not left behind
    client.images.remove(tag)


@pytest.mark.slow
def test_python_constraint_mismatch_is_a_clear_error(docker_base):
    from patchgym.sandboxes.docker.images import environment_image

    with pytest.raises(EnvironmentBuildError, match=r"bookworm provides Python 3\.11.*'==3\.9'"):
        environment_image(EnvironmentSpec(python="==3.9", packages=("pytest==8.3.5",)), release="bookworm")


def _tiny_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"hi\n"))
    return buf.getvalue()


@pytest.mark.slow
def test_list_and_prune_touch_only_labelled_images(client, docker_base, env_tag):
    from patchgym.sandboxes.docker.images import list_images, prune_images

    run_id = uuid.uuid4().hex[:8]
    kind = f"test-{run_id}"  # a kind of our own, so a real prune cannot touch anyone else's images
    repo = f"patchgym-test/{run_id}"
    made: list[str] = []
    containers = []
    try:
        # unlabelled: an imported scratch image, and a `docker commit` of a throwaway container of it
        client.api.import_image_from_data(_tiny_tar(), repository=repo, tag="plain")
        made.append(f"{repo}:plain")
        throwaway = client.containers.create(f"{repo}:plain", ["/nothing"])
        containers.append(throwaway)
        throwaway.commit(repository=repo, tag="committed")
        made.append(f"{repo}:committed")
        # labelled, of our test kind: one unused, one used by a (never started) container
        for name in ("unused", "used"):
            box = client.containers.create(docker_base, ["true"], labels={MANAGED_LABEL: "1", KIND_LABEL: "build"})
            containers.append(box)
            box.commit(repository=repo, tag=name, changes=[f"LABEL {KIND_LABEL}={kind}"])
            made.append(f"{repo}:{name}")
        containers.append(client.containers.create(f"{repo}:used", ["true"]))

        listed = {row["tag"]: row for row in list_images()}
        assert f"{repo}:unused" in listed and listed[f"{repo}:unused"]["kind"] == kind
        assert f"{repo}:plain" not in listed and f"{repo}:committed" not in listed
        assert docker_base in listed and env_tag in listed
        assert {"tag", "kind", "id", "size", "created"} <= set(listed[env_tag])

        would = prune_images(dry_run=True)  # default kinds: instance, env
        assert docker_base not in would and not any(ref.startswith(repo) for ref in would)
        assert client.images.get(env_tag)  # a dry run removes nothing

        assert prune_images([kind]) == [f"{repo}:unused"]
        tags = {t for image in client.images.list(name=repo) for t in image.tags}
        assert tags == {f"{repo}:plain", f"{repo}:committed", f"{repo}:used"}
        assert client.images.get(docker_base)
    finally:
        for box in containers:
            box.remove(force=True)
        for ref in reversed(made):
            try:
                client.images.remove(ref, force=True)
            except Exception:
                pass


@pytest.mark.slow
def test_build_steps_get_the_hosts_pip_variables_minus_missing_paths(client, docker_base, monkeypatch, tmp_path):
    from patchgym.sandboxes.docker.images import BuildContainer

    monkeypatch.setenv("PIP_FIND_LINKS", "/no/such/wheels https://wheels.example/simple")
    monkeypatch.setenv("PIP_CONSTRAINT", "/no/such/constraints.txt")
    monkeypatch.setenv("PIP_INDEX_URL", "https://pypi.example/simple")
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    with BuildContainer(docker_base, tmp_path / "build.log", purpose="test") as box:
        env = box.env
        name = box.container.name
    assert env["PIP_FIND_LINKS"] == "https://wheels.example/simple" and "PIP_CONSTRAINT" not in env
    assert env["PIP_INDEX_URL"] == "https://pypi.example/simple" and env["https_proxy"] == "http://proxy.example:3128"
    assert env["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt" and "UNRELATED_SECRET" not in env
    assert not client.containers.list(all=True, ignore_removed=True, filters={"name": name})  # always removed


@pytest.mark.slow
def test_cli_build_list_and_errors(client, calc_tasks_file):
    from patchgym.cli import app, common

    common.out.width = common.console.width = 300
    runner = CliRunner()

    first = runner.invoke(app, ["images", "build", "--tasks", str(calc_tasks_file)], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    assert "fixture__calc-1" in first.output and "patchgym/instance:" in first.output and "0 failed" in first.output
    again = runner.invoke(app, ["images", "build", "--tasks", str(calc_tasks_file)], catch_exceptions=False)
    assert "0 built, 1 cached, 0 failed" in again.output
    tag = next(w for w in again.output.split() if w.startswith("patchgym/instance:"))

    listed = runner.invoke(app, ["images", "list"], catch_exceptions=False)
    assert listed.exit_code == 0 and "patchgym/base:bookworm" in listed.output and tag in listed.output

    bad = runner.invoke(app, ["images", "bootstrap", "--release", "hamm"])
    assert bad.exit_code == 2 and "error:" in bad.output and "unknown release" in bad.output
    unknown = runner.invoke(app, ["images", "build", "--tasks", str(calc_tasks_file), "--instance-ids", "nope"])
    assert unknown.exit_code == 2 and "error:" in unknown.output

    # a task whose environment cannot be built is reported, not raised
    row = json.loads(Path(calc_tasks_file).read_text().splitlines()[0])
    row["environment"]["python"] = "==2.7"
    broken = Path(calc_tasks_file).with_name("broken.jsonl")
    broken.write_text(json.dumps(row) + "\n")
    failed = runner.invoke(app, ["images", "build", "--tasks", str(broken)], catch_exceptions=False)
    text = " ".join(failed.output.split())
    assert failed.exit_code == 1 and "1 failed" in text and "satisfies '==2.7'" in text, text
    forced = runner.invoke(app, ["images", "build", "--tasks", str(broken), "--release", "bookworm"],
                           catch_exceptions=False)
    assert forced.exit_code == 1 and "Python 3.11" in forced.output
    client.images.remove(tag)  # keyed by the session's temporary repository path: never reused
