"""A Hugging Face name on a host without network: one clear message at once, no retries, the hint
to export the rows to a file (the network is made unreachable with monkeypatch)."""

from __future__ import annotations

import os
import socket
import time

import pytest

from patchgym.tasks import row_sources
from patchgym.tasks.model import TaskFileError

pytest.importorskip("datasets")
NAME = "patchgym-tests/no-such-dataset"  # in no cache


@pytest.fixture
def no_network(monkeypatch):
    """Every connection fails at once, as on a host with no route; the attempts are counted."""
    attempts: list[object] = []

    def refuse(address, *args, **kwargs):
        attempts.append(address)
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", lambda self, address: refuse(address))
    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(variable, raising=False)
    return attempts


def test_an_unreachable_hub_says_so_once_with_the_export_hint(no_network):
    started = time.monotonic()
    with pytest.raises(TaskFileError) as caught:
        list(row_sources.read_source_rows(f"{NAME}:dev"))
    message = str(caught.value)
    assert message.startswith(f"{NAME}: the Hugging Face Hub (https://huggingface.co) cannot be reached from here, "
                              "and split 'dev' of this dataset is not in the local cache; export its rows to a file")
    assert f"datasets.load_dataset('{NAME}', split='dev').to_json('rows.jsonl')" in message
    assert no_network == [("huggingface.co", 443)], "one probe, then the cache only: no retries"
    assert time.monotonic() - started < 20
    assert "HF_HUB_OFFLINE" not in os.environ, "offline mode is set for the call only"


def test_offline_mode_asked_for_needs_no_probe(no_network, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TaskFileError, match=r"offline mode is set \(HF_HUB_OFFLINE\).*export its rows"):
        list(row_sources.read_source_rows(NAME))
    assert no_network == []


def test_the_probe_uses_the_configured_endpoint(no_network, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.internal:8080")
    assert not row_sources.hub_reachable(row_sources.hub_endpoint())
    assert no_network == [("hub.internal", 8080)]
