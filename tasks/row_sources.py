"""SWE-bench rows from wherever users keep them: JSON/JSONL files, parquet files, Hugging Face datasets.

SWE-bench Lite and Verified are published as Hugging Face datasets (parquet underneath); people
also keep them as JSON or JSONL exports. :func:`read_source_rows` takes any of:

* a ``.json`` (array) or ``.jsonl`` file: read here, errors name the line;
* a ``.parquet`` file: read with pyarrow (``pip install pyarrow``);
* a Hugging Face dataset: a name (``princeton-nlp/SWE-bench_Lite``), a local dataset directory, or
  either with a split (``NAME:test``, ``NAME[dev]``; default ``test``), read with the ``datasets``
  library when it is installed (``pip install datasets``; its cache and ``HF_*`` settings apply).
  Where the Hub cannot be reached (a fast probe) or ``HF_HUB_OFFLINE`` is set, only the local
  cache is read, with no retries, and a dataset not there ends with one message: export the rows
  to a file.

Every row comes out as plain Python values (lists and strings, not arrays), with a ``where`` that
says which file or split and which row.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from patchgym.tasks.model import TaskFileError, read_rows

DEFAULT_SPLIT = "test"
_HF_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_WITH_SPLIT = re.compile(r"(?P<name>.+?)(?::(?P<a>[\w.-]+)|\[(?P<b>[\w.-]+)\])")
FILE_SUFFIXES = (".json", ".jsonl", ".parquet")
PROBE_TIMEOUT = 3.0  # seconds for the Hub to accept a connection
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def read_source_rows(source: str | Path) -> Iterator[tuple[str, Any]]:
    """``(where, row)`` for each row of ``source`` (see the module docstring for what it may be)."""
    path = Path(source)
    if path.is_file():
        return _parquet_rows(path) if path.suffix == ".parquet" else read_rows(path)
    name, split = str(source), None
    if (match := _WITH_SPLIT.fullmatch(name)) and not path.exists():
        name, split = match.group("name"), match.group("a") or match.group("b")
    if Path(name).is_dir() or (_HF_NAME.fullmatch(name) and not name.endswith(FILE_SUFFIXES)):
        return _dataset_rows(name, split or DEFAULT_SPLIT)
    raise TaskFileError(f"{source}: no such file, and not a Hugging Face dataset (owner/name[:split]) "
                        "or a dataset directory")


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskFileError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own error types for every kind of bad file
        raise TaskFileError(f"{path}: cannot read parquet: {exc}") from None
    return ((f"row {n}", row) for n, row in enumerate(table.to_pylist(), 1))


def hub_endpoint() -> str:
    """The Hub the datasets library would ask (``HF_ENDPOINT``, else huggingface.co)."""
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def hub_reachable(endpoint: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether a TCP connection to the Hub opens within ``timeout``: a fast probe, so that a host
    without network is told so at once instead of after the datasets library's retries."""
    url = urlsplit(endpoint)
    host, port = url.hostname or "", url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _offline_requested() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


@contextmanager
def _offline_mode() -> Iterator[None]:
    """The datasets library in offline mode (cache only, no retries), for the call only: the
    variables are read when the libraries are imported, so their settings are set too."""
    saved = {v: os.environ.get(v) for v in _OFFLINE_VARIABLES}
    os.environ.update(dict.fromkeys(_OFFLINE_VARIABLES, "1"))
    patched = []
    for module, attribute in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE"),
                              ("datasets.config", "HF_DATASETS_OFFLINE")):
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, attribute):
            patched.append((loaded, attribute, getattr(loaded, attribute)))
            setattr(loaded, attribute, True)
    try:
        yield
    finally:
        for loaded, attribute, value in patched:
            setattr(loaded, attribute, value)
        for variable, value in saved.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value


def _export_hint(name: str, split: str) -> str:
    return (f"export its rows to a file where the Hub can be reached and pass that file instead, e.g. "
            f"python -c \"import datasets; datasets.load_dataset('{name}', split='{split}').to_json('rows.jsonl')\" "
            f"(or a dataset directory, or the Hub's parquet files)")


def _dataset_rows(name: str, split: str) -> Iterator[tuple[str, Any]]:
    local = Path(name).is_dir()
    offline = not local and (_offline_requested() or not hub_reachable(hub_endpoint()))
    try:
        with _offline_mode() if offline else nullcontext():
            import datasets

            data = datasets.load_dataset(name, split=split)
    except ImportError:
        raise TaskFileError(f"{name}: reading a Hugging Face dataset needs the datasets library "
                            "(pip install datasets), or export it to JSONL/parquet first") from None
    except Exception as exc:  # network, missing dataset or split, bad files: all reported the same way
        if offline:
            why = ("offline mode is set (HF_HUB_OFFLINE)" if _offline_requested()
                   else f"the Hugging Face Hub ({hub_endpoint()}) cannot be reached from here")
            raise TaskFileError(f"{name}: {why}, and split {split!r} of this dataset is not in the local "
                                f"cache; {_export_hint(name, split)}") from None
        raise TaskFileError(f"{name}: cannot load split {split!r} of this dataset: {exc}") from None
    return ((f"{split}[{n}]", dict(row)) for n, row in enumerate(data))
