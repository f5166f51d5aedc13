"""Environment packages through uv under the host's pip settings, and pip when uv cannot."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from patchgym.sandboxes import installer
from patchgym.sandboxes.base import EnvironmentBuildError
from patchgym.sandboxes.environments import install_packages, venv_environ


def test_pip_settings_merge_files_and_variables_as_pip_does(tmp_path):
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://pypi.internal/simple\nfind-links = /srv/wheels\n"
                      "constraint = /etc/pins.txt\ncert = /etc/corp-ca.pem\n"
                      "[install]\ntrusted-host = pypi.internal\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"PIP_CONFIG_FILE": str(config), "PIP_FIND_LINKS": "/a /b", "HOME": str(tmp_path)}
    settings = installer.pip_settings(env)
    assert settings["index-url"] == "https://pypi.internal/simple" and settings["cert"] == "/etc/corp-ca.pem"
    assert settings["find-links"] == "/a /b", "a PIP_ variable wins over the file"
    options, environ = installer.uv_options(settings)
    assert options[:2] == ["--index-strategy", "unsafe-best-match"], "every index, as pip reads them"
    pairs = list(zip(options[2::2], options[3::2], strict=True))
    assert ("--index-url", "https://pypi.internal/simple") in pairs
    assert ("--find-links", "/a") in pairs and ("--find-links", "/b") in pairs
    assert ("--constraint", "/etc/pins.txt") in pairs and ("--allow-insecure-host", "pypi.internal") in pairs
    assert environ["SSL_CERT_FILE"] == "/etc/corp-ca.pem", "the host's CA bundle reaches uv"


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


@pytest.fixture
def wheel_dir(tmp_path) -> Path:
    """A directory holding one wheel, written here: installs need no index."""
    out = tmp_path / "wheels"
    out.mkdir()
    info = "pgdemo-1.0.dist-info"
    files = {"pgdemo/__init__.py": "VALUE = 42\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: pgdemo\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: patchgym-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(out / "pgdemo-1.0-py3-none-any.whl", "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
        whl.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"]))
    return out


@pytest.mark.skipif(installer.uv_executable() is None, reason="uv is not installed")
def test_uv_installs_from_the_hosts_find_links(tmp_path, wheel_dir, monkeypatch):
    monkeypatch.setenv("PATCHGYM_INSTALLER", "uv")
    venv = _venv(tmp_path / "venv")
    env = venv_environ(venv) | {"PIP_FIND_LINKS": str(wheel_dir), "PIP_NO_INDEX": "1"}
    log = tmp_path / "build.log"
    assert install_packages(venv, ("pgdemo==1.0",), log, cwd=tmp_path, env=env) == "uv"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import pgdemo; print(pgdemo.VALUE)"],
                         capture_output=True, text=True)
    assert out.stdout.strip() == "42", log.read_text()
    cached = list(venv.glob("lib/python*/site-packages/pgdemo/__pycache__/__init__.*.pyc"))
    assert cached, "installed with its bytecode, as pip installs (graded runs write none)"


def test_a_failing_uv_falls_back_to_pip_and_says_so(tmp_path, wheel_dir, monkeypatch):
    monkeypatch.setattr(installer, "uv_executable", lambda: "/bin/false")
    monkeypatch.setattr("patchgym.sandboxes.environments.uv_executable", lambda: "/bin/false")
    monkeypatch.setenv("PATCHGYM_INSTALLER", "auto")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = venv_environ(venv) | {"PIP_FIND_LINKS": str(wheel_dir), "PIP_NO_INDEX": "1"}
    log = tmp_path / "build.log"
    assert install_packages(venv, ("pgdemo==1.0",), log, cwd=tmp_path, env=env) == "pip"
    assert "uv failed: installing the same packages with pip" in log.read_text()
    monkeypatch.setenv("PATCHGYM_INSTALLER", "uv")
    with pytest.raises(EnvironmentBuildError, match="environment step failed"):
        install_packages(venv, ("pgdemo==1.0",), log, cwd=tmp_path, env=env)
