"""SWE-bench rows from wherever users keep them: JSON/JSONL files, parquet files, Hugging Face datasets.

SWE-bench Lite and Verified are published as Hugging Face datasets (parquet underneath); people
also keep them as JSON or JSONL exports. :func:`read_source_rows` takes any of:

* a ``.json`` (array) or ``.jsonl`` file: read here, errors name the line;
* a ``.parquet`` file: read with pyarrow (``pip install pyarrow``);
* a Hugging Face dataset: a name (``princeton-nlp/SWE-bench_Lite``), a local dataset directory, or
  either with a split (``NAME:test``, ``NAME[dev]``; default ``test``), read with the ``datasets``
  library when it is installed (``pip install datasets``; its cache and ``HF_*`` settings apply).

Every row comes out as plain Python values (lists and strings, not arrays), with a ``where`` that
says which file or split and which row.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasks.model import TaskFileError, read_rows

DEFAULT_SPLIT = "test"
_HF_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_WITH_SPLIT = re.compile(r"(?P<name>.+?)(?::(?P<a>[\w.-]+)|\[(?P<b>[\w.-]+)\])")
FILE_SUFFIXES = (".json", ".jsonl", ".parquet")


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


def _dataset_rows(name: str, split: str) -> Iterator[tuple[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise TaskFileError(f"{name}: reading a Hugging Face dataset needs the datasets library "
                            "(pip install datasets), or export it to JSONL/parquet first") from None
    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as exc:  # network, missing dataset or split, bad files: all reported the same way
        raise TaskFileError(f"{name}: cannot load split {split!r} of this dataset: {exc}") from None
    return ((f"{split}[{n}]", dict(row)) for n, row in enumerate(data))
