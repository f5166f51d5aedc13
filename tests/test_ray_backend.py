"""The ray backend: plain unit tests of its node side, and the cluster tests of tests/ray_cluster/
run in a network namespace that has only loopback (Ray's daemons listen on every interface).

The cluster tests are a pytest run of their own (``netns_*.py`` files, not collected here): a
two-node ``ray.cluster_utils.Cluster`` on 127.0.0.1 inside ``ip netns exec``. They need root and
iproute2; ``PATCHGYM_REQUIRE_RAY=1`` (set by CI) turns a skip for a missing requirement into a failure.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandboxes import SandboxError
from sandboxes.ray_cluster import host
from tests.netns import Netns
from tests.ray_cluster.helpers import build_environments

ROOT = Path(__file__).resolve().parent.parent


def _missing() -> str | None:
    try:
        import ray  # noqa: F401
    except ImportError:
        return "ray is not installed (pip install 'patchgym[ray]')"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux")):
        if not shutil.which(tool):
            return f"{package} ({tool}) is not installed"
    return None


def test_cluster_tests_in_a_loopback_only_namespace(tmp_path):
    missing = _missing()
    if missing:
        if os.environ.get("PATCHGYM_REQUIRE_RAY") == "1":
            pytest.fail(f"PATCHGYM_REQUIRE_RAY=1 but {missing}")
        pytest.skip(missing)
    # The namespace has no network: the bundled tasks' environments are built here first, into the
    # home the cluster's nodes then share with this session.
    home = os.environ["PATCHGYM_HOME"]
    build_environments()
    log = tmp_path / "cluster-tests.log"
    with Netns("pg-ray") as ns, log.open("w") as sink:
        env = {**os.environ, "PATCHGYM_IN_NETNS": ns.name, "PATCHGYM_TEST_HOME": home, "RAY_USAGE_STATS_ENABLED": "0"}
        try:
            code = subprocess.run(
                ns.enter([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "python_files=netns_*.py",
                         "--timeout", "240", "-rfE", str(ROOT / "tests" / "ray_cluster")]),
                cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=540).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        leftovers = ns.pids()
    output = log.read_text()
    print(output[-20000:])
    assert code == 0, f"the cluster tests failed ({code}):\n{output[-20000:]}"
    assert "passed" in output and " skipped" not in output, output[-3000:]
    assert not leftovers, f"processes were left in the namespace: {leftovers}"


# -- the node side, without a cluster -------------------------------------------------------


def test_an_exception_that_cannot_cross_to_the_driver_becomes_a_sandbox_error():
    class Unpicklable(Exception):
        def __init__(self, a, b):
            super().__init__(a)

    portable = host._portable(Unpicklable("x", "y"))
    assert isinstance(portable, SandboxError) and "Unpicklable" in str(portable)
    keep = FileNotFoundError(2, "gone")
    assert host._portable(keep) is keep


def test_a_node_asks_for_the_repository_when_it_lacks_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATCHGYM_HOME", str(tmp_path / "home"))
    h = host.SandboxHost.__new__(host.SandboxHost)  # no guard: only the shipping logic is exercised
    missing = str(tmp_path / "not-here.bundle")
    assert h._repository(missing, "auto", None, None) is None  # ask the driver
    assert h._repository("https://example.invalid/r.git", "auto", None, None) == "https://example.invalid/r.git"
    present = tmp_path / "r.bundle"
    present.write_bytes(b"bundle bytes")
    assert h._repository(str(present), "auto", None, None) == str(present)
    assert h._repository(str(present), "always", None, None) is None  # ship even though it exists
    data = b"the driver's bundle"
    digest = hashlib.sha256(data).hexdigest()
    assert h._repository(missing, "auto", digest, None) is None  # not kept yet: send the bytes
    kept = h._repository(missing, "auto", digest, data)
    assert Path(kept).read_bytes() == data and Path(kept).parent == host.shipped_dir()
    assert h._repository(missing, "auto", digest, None) == kept  # kept by digest: not sent again
    with pytest.raises(SandboxError, match="corrupt"):
        h._repository(missing, "auto", hashlib.sha256(b"other").hexdigest(), data)
