"""A two-node Ray cluster on 127.0.0.1 for the ray backend's tests (run by tests/test_ray_backend.py
inside a loopback-only network namespace; refused anywhere else)."""

from __future__ import annotations

import os
import socket

import pytest

from tests.ray_cluster.helpers import SLOTS_PER_NODE

NODE = {"num_cpus": 1, "resources": {"patchgym_sandbox": SLOTS_PER_NODE}, "node_ip_address": "127.0.0.1",
        "object_store_memory": 150 * 1024 * 1024}


def pytest_collection_modifyitems(config, items):
    interfaces = sorted(name for _, name in socket.if_nameindex())  # of this network namespace
    if not os.environ.get("PATCHGYM_IN_NETNS") or interfaces != ["lo"]:
        reason = f"run through tests/test_ray_backend.py, in a namespace with only loopback (here: {interfaces})"
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    c.add_node(**NODE)
    c.wait_for_nodes()
    ray.init(address=c.address, namespace="patchgym-tests", log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="session")
def task_set():
    from tasks.catalog import load_task_set

    return load_task_set()


@pytest.fixture()
def task(task_set):
    return task_set.get("patchgym__semverkit-1")
