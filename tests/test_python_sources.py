"""Where an environment's Python comes from: Debian releases, then ``$PATCHGYM_PYTHON_ARCHIVES``
(python-build-standalone archives installed by uv), on both backends; and what a constraint that
none of them meets says.

The archives here are made from the CPython running the tests (:mod:`pbs_archive`,
:func:`patchgym.sandboxes.python_archives.pack_installation`): this machine
and CI reach no GitHub, and the interpreters they have are 3.9-3.13, so the mechanism is tested
with the running one's exact version, which no Debian release ships (3.9.2, 3.11.2, 3.13.5).
"""

from __future__ import annotations

import json
import subprocess

import pytest
from pbs_archive import host_cpython, make_archive

from patchgym.sandboxes import EnvironmentBuildError, EnvironmentSpec
from patchgym.sandboxes import python_archives as pa

ARCH = pa.machine_arch()


def _touch(directory, *names):
    for name in names:
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode())


def test_archive_names_are_read_and_the_newest_fitting_one_is_picked(tmp_path):
    _touch(tmp_path, f"cpython-3.7.17+20230826-{ARCH}-unknown-linux-gnu-install_only.tar.gz",
           f"20240814/cpython-3.8.19+20240814-{ARCH}-unknown-linux-gnu-install_only_stripped.tar.gz",
           f"cpython-3.8.20+20241002-{ARCH}-unknown-linux-gnu-install_only.tar.gz",
           "cpython-3.8.21+20250101-riscv99-unknown-linux-gnu-install_only.tar.gz",  # another machine's
           f"cpython-3.10.9+20230116-{ARCH}-unknown-linux-gnu-pgo+lto-full.tar.zst",  # not an install_only
           "README.txt")
    found = pa.find_archives(tmp_path)
    assert [a.version for a in found] == ["3.7.17", "3.8.19", "3.8.20"], "subdirectories too (a mirror's layout)"
    assert pa.pick_archive(EnvironmentSpec(python="3.8").specifier(), found).version == "3.8.20"
    assert pa.pick_archive(EnvironmentSpec(python="<3.8").specifier(), found).version == "3.7.17"
    assert pa.pick_archive(EnvironmentSpec(python="3.6").specifier(), found) is None
    assert pa.describe(tmp_path) == f"archives in $PATCHGYM_PYTHON_ARCHIVES={tmp_path}: 3.7.17, 3.8.19, 3.8.20"
    assert pa.describe(None) == "no archive directory ($PATCHGYM_PYTHON_ARCHIVES is not set)"

    listing = pa.downloads_json([found[0]], lambda a: f"file:///stage/{a.path.name}")
    (entry,) = listing.values()
    assert list(listing) == [f"cpython-3.7.17-linux-{ARCH}-gnu"]
    assert (entry["major"], entry["minor"], entry["patch"], entry["os"], entry["libc"]) == (3, 7, 17, "linux", "gnu")
    assert entry["url"] == f"file:///stage/{found[0].path.name}" and len(entry["sha256"]) == 64
    assert entry["arch"] == {"family": ARCH, "variant": None} and entry["build"] == "20230826"


def test_docker_chain_debian_first_then_archives_else_every_place_named(tmp_path, monkeypatch):
    """No Docker needed: the choice reads the known releases, the base images' labels and the
    archive directory's file names."""
    from patchgym.sandboxes.docker import images

    monkeypatch.setattr(images, "_base_pythons", lambda: {})
    monkeypatch.setattr(images, "DEFAULT_RELEASE", "bookworm")
    _touch(tmp_path, f"cpython-3.7.17+20230826-{ARCH}-unknown-linux-gnu-install_only.tar.gz",
           f"cpython-3.12.4+20240713-{ARCH}-unknown-linux-gnu-install_only.tar.gz")
    monkeypatch.setenv("PATCHGYM_PYTHON_ARCHIVES", str(tmp_path))

    source = images.python_source(EnvironmentSpec(python="3.9"))
    assert (source.release, source.archive) == ("bullseye", None), "a Debian release whose python3 fits comes first"
    source = images.python_source(EnvironmentSpec(python="3.12"))
    assert (source.release, source.archive.version) == ("bookworm", "3.12.4"), "else an archive, on the default release"
    source = images.python_source(EnvironmentSpec(python="3.7"), "bullseye")
    assert (source.release, source.archive.version) == ("bullseye", "3.7.17"), "on the release asked for"
    assert images.python_source(EnvironmentSpec(python="3.11"), "bookworm").archive is None

    with pytest.raises(EnvironmentBuildError) as caught:
        images.python_source(EnvironmentSpec(python="3.6"))
    message = str(caught.value)
    assert "satisfies '3.6'" in message, "the constraint"
    assert "bullseye 3.9.2, bookworm 3.11.2, trixie 3.13.5" in message, "the Debian releases looked at"
    assert f"archives in $PATCHGYM_PYTHON_ARCHIVES={tmp_path}: 3.7.17, 3.12.4" in message, "the archives looked at"
    assert "--backend local" in message and "install_only.tar.gz" in message, "what to do"

    assert "UV_PYTHON_INSTALL_MIRROR is not set" in message

    monkeypatch.delenv("PATCHGYM_PYTHON_ARCHIVES")
    with pytest.raises(EnvironmentBuildError, match=r"bookworm provides Python 3\.11\.2.*'==3\.12'.*"
                                                    r"\$PATCHGYM_PYTHON_ARCHIVES is not set"):
        images.python_source(EnvironmentSpec(python="==3.12"), "bookworm")

    # Last, a python-build-standalone mirror the build downloads from (uv checks its archives'
    # hashes); a file:// one is the host's, which a build cannot see.
    monkeypatch.setenv("UV_PYTHON_INSTALL_MIRROR", "file:///srv/pbs")
    with pytest.raises(EnvironmentBuildError, match="UV_PYTHON_INSTALL_MIRROR=file:///srv/pbs is not an http"):
        images.python_source(EnvironmentSpec(python="3.6"))
    monkeypatch.setenv("UV_PYTHON_INSTALL_MIRROR", "https://user:secret@pbs.internal:8443/releases/download/")
    source = images.python_source(EnvironmentSpec(python="3.6"))
    assert (source.release, source.archive, source.mirror) == (
        "bookworm", None, "https://user:secret@pbs.internal:8443/releases/download")
    assert source.describe() == "https://pbs.internal:8443/releases/download", "no credentials in labels or logs"
    keys = {images.environment_key(EnvironmentSpec(python="3.6"), "sha256:b", s) for s in
            (None, source, images.PythonSource("bookworm", mirror="https://other.internal"))}
    assert len(keys) == 3, "an environment's key holds where its Python came from"


def test_local_chain_names_the_archive_directory_when_nothing_fits(tmp_path, monkeypatch):
    from patchgym.sandboxes import environments

    _touch(tmp_path, f"cpython-3.7.17+20230826-{ARCH}-unknown-linux-gnu-install_only.tar.gz")
    monkeypatch.setenv("PATCHGYM_PYTHON_ARCHIVES", str(tmp_path))
    monkeypatch.setattr(environments, "_candidate_executables", lambda: ["/opt/python3.6/bin/python3"])
    monkeypatch.setattr(environments, "_fitting", lambda wanted: [])  # not starting every host interpreter
    environments._uv_python_install.cache_clear()
    try:
        with pytest.raises(EnvironmentBuildError) as caught:
            environments.find_interpreter(EnvironmentSpec(python="==2.6"))
    finally:
        environments._uv_python_install.cache_clear()
    message = str(caught.value)
    assert message.startswith("no Python interpreter on this host satisfies '==2.6' (looked at /opt/python3.6/bin/")
    assert f"archives in $PATCHGYM_PYTHON_ARCHIVES={tmp_path}: 3.7.17" in message


@pytest.fixture(scope="module")
def host_archive(tmp_path_factory):
    """An archive of the running CPython (and one misnamed 3.99.1) in a directory of their own."""
    prefix, version = host_cpython()
    out = tmp_path_factory.mktemp("archives")
    made = make_archive(prefix, out, tmp_path_factory.mktemp("stage"))
    if made is None:
        pytest.skip(f"the running CPython ({prefix}) does not run from a copy: no archive can be made of it")
    return out, version


def test_local_backend_installs_an_archive_with_uv_and_refuses_a_misnamed_one(host_archive, tmp_path, monkeypatch):
    from patchgym.sandboxes import environments
    from patchgym.sandboxes.installer import uv_executable

    if uv_executable() is None:
        pytest.skip("uv is not installed")
    directory, version = host_archive
    monkeypatch.setenv("PATCHGYM_PYTHON_ARCHIVES", str(directory))
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(tmp_path / "uv-python"))
    environments._uv_python_install.cache_clear()
    try:
        assert environments._uv_python_install(version) is None
    finally:
        environments._uv_python_install.cache_clear()
    installed = tmp_path / "uv-python" / f"cpython-{version}-linux-{ARCH}-gnu" / "bin" / "python3"
    assert str(installed) in environments._candidate_executables(), "a host interpreter from then on"
    out = subprocess.run([str(installed), "-c", "import sys, json; print(json.dumps([sys.version.split()[0], "
                          "sys.prefix]))"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [version, str(installed.parent.parent)]

    # An archive whose name promises another version: installed by uv, probed, not taken (only
    # uv's interpreters are looked at: probing every one of the host's takes seconds).
    every = environments._candidate_executables
    monkeypatch.setattr(environments, "_candidate_executables",
                        lambda: [exe for exe in every() if exe.startswith(str(tmp_path))])
    lie = ".".join(version.split(".")[:2]) + ".99"
    (tmp_path / "misnamed").mkdir()
    (tmp_path / "misnamed" / f"cpython-{lie}+20260101-{ARCH}-unknown-linux-gnu-install_only.tar.gz").symlink_to(
        next(directory.glob("cpython-*.tar.gz")))
    monkeypatch.setenv("PATCHGYM_PYTHON_ARCHIVES", str(tmp_path / "misnamed"))
    try:
        with pytest.raises(EnvironmentBuildError, match=f"satisfies '=={lie}'.*does not satisfy it either"):
            environments.find_interpreter(EnvironmentSpec(python=f"=={lie}"))
    finally:
        environments._uv_python_install.cache_clear()


@pytest.mark.slow
def test_docker_environment_gets_its_python_from_the_archive_directory(host_archive, docker_base, monkeypatch):
    """A constraint no Debian release meets (the running CPython's exact version) is built on the
    default release with that archive, installed by uv in the build: the venv runs it."""
    from patchgym.sandboxes.docker import images
    from patchgym.sandboxes.docker.client import KIND_LABEL, MANAGED_LABEL, docker_client

    directory, version = host_archive
    if version in images.RELEASE_PYTHON.values():
        pytest.skip(f"Debian ships Python {version} itself: the archive would not be needed")
    monkeypatch.setenv("PATCHGYM_PYTHON_ARCHIVES", str(directory))
    messages: list[str] = []
    tag = images.environment_image(EnvironmentSpec(python=f"=={version}"), progress=messages.append)
    client = docker_client()
    try:
        image = client.images.get(tag)
        assert image.labels[images.PYTHON_LABEL] == version
        assert image.labels[images.PYTHON_SOURCE_LABEL].startswith(f"cpython-{version}+")
        assert any(m.startswith(f"installing Python {version} with uv") for m in messages), messages
        script = ("import sys, json, os; print(json.dumps([sys.version.split()[0], sys.base_prefix, sys.prefix, "
                  f"os.path.exists({images.PYTHON_STAGE!r})]))")
        out = client.containers.run(tag, ["python", "-c", script], remove=True, network_mode="none",
                                    labels={MANAGED_LABEL: "1", KIND_LABEL: "build"}).decode()
        assert json.loads(out) == [version, f"{images.PYTHON_ROOT}/cpython-{version}-linux-{ARCH}-gnu",
                                   images.VENV, False], "the venv runs the archive's CPython; uv and the archive are gone"
        again: list[str] = []
        assert images.environment_image(EnvironmentSpec(python=f"=={version}"), progress=again.append) == tag
        assert again == [], "built once"
    finally:
        client.images.remove(tag)  # its key holds the archive's hash: made by this run only
