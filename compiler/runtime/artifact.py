"""The on-disk form of a compiled model, the same for every backend: a directory holding

* ``manifest.json``: ``format`` (``kiln-<backend>-model``, which names the backend that loads it),
  ``format_version``, the model's name, target, kernels, buffers, launches, inputs, outputs, memory plan
  and metadata, the name and sha256 of the source file, plus what the backend adds (the CPU: the host it
  was built on and its shared object; CUDA: each kernel's grid and block);
* the generated source (``model.c``, ``model.cu``) and any file the backend adds (``model.so``);
* ``params.npz``: the params, read back with ``allow_pickle=False`` (no pickle anywhere).

Every file is written atomically (:mod:`compiler.runtime.module_cache`: a temporary file, then
``os.replace``) and the manifest last, so a directory with a manifest is complete. This module reads and
writes the files; :class:`~compiler.runtime.executor.CompiledModel` turns them into a model.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import KilnError
from compiler.runtime.module_cache import replacing, write_atomic

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PARAMS = "params.npz"

def format_name(backend: str) -> str:
    """The manifest ``format`` of a model of ``backend`` (``kiln-cpu-model``)."""
    return f"kiln-{backend}-model"


@dataclass
class SavedModel:
    """What :func:`read_model` found in a model directory (source checked against its hash)."""

    directory: Path
    backend: str
    manifest: dict[str, Any]
    source: str
    params: dict[int, np.ndarray]


def write_model(
    directory: Path,
    backend: str,
    manifest: Mapping[str, Any],
    source_name: str,
    source: str,
    params: Mapping[int, np.ndarray],
    files: Mapping[str, bytes] | None = None,
) -> Path:
    """Write a model of ``backend`` to ``directory`` (created if missing); returns the manifest's path.

    ``manifest`` holds the model's own fields; ``format``, ``format_version``, ``source``,
    ``source_sha256`` and ``params`` are added here. ``files`` are extra files (name -> bytes).
    """
    directory.mkdir(parents=True, exist_ok=True)
    data = source.encode()
    full = {
        **manifest,
        "format": format_name(backend),
        "format_version": FORMAT_VERSION,
        "source": source_name,
        "source_sha256": hashlib.sha256(data).hexdigest(),
        "params": PARAMS,
    }
    write_atomic(directory / source_name, data)
    for name, content in (files or {}).items():
        write_atomic(directory / name, content)
    with replacing(directory / PARAMS) as tmp:
        np.savez(tmp, **{f"p{i}": a for i, a in params.items()})
    path = directory / MANIFEST
    write_atomic(path, json.dumps(full, indent=2, sort_keys=True).encode())
    return path


def read_manifest(directory: Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` of ``directory`` (KilnError when it is missing or not JSON)."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KilnError(f"cannot read compiled model manifest {path}: {exc}") from exc
    if not isinstance(manifest, dict):
        raise KilnError(f"{path} is not a compiled model manifest (a JSON object)")
    return manifest


def read_model(directory: Path) -> SavedModel:
    """Read a model written by :func:`write_model`: backend (from ``format``), manifest, source, params."""
    path = directory / MANIFEST
    manifest = read_manifest(directory)
    fmt = manifest.get("format")
    m = re.fullmatch(r"kiln-(\w+)-model", fmt) if isinstance(fmt, str) else None
    if m is None:
        raise KilnError(f"{path} is not a Kiln compiled model (format {fmt!r})")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise KilnError(
            f"{path} has format version {version!r}; this Kiln reads version {FORMAT_VERSION}: "
            "recompile the model"
        )
    source_path = directory / manifest["source"]
    source = source_path.read_bytes()
    if hashlib.sha256(source).hexdigest() != manifest["source_sha256"]:
        raise KilnError(f"{source_path} does not match its manifest (edited or corrupted)")
    with np.load(directory / manifest["params"], allow_pickle=False) as npz:
        params = {int(k[1:]): npz[k] for k in npz.files}
    return SavedModel(directory, m.group(1), manifest, source.decode(), params)
