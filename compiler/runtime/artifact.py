"""The on-disk form of a compiled model, the same for every backend: a directory holding

* ``manifest.json``: ``format`` (``kiln-<backend>-model``, which names the backend that loads it),
  ``format_version``, the model's name, target, kernels, buffers, launches, inputs, outputs, memory plan
  and metadata, the name and sha256 of the source file, ``files_sha256`` (the sha256 of every other file:
  the params and what the backend adds), plus what the backend adds (the CPU: the host it was built on and
  its shared object; CUDA: each kernel's grid and block);
* the generated source (``model.c``, ``model.cu``) and any file the backend adds (``model.so``);
* ``params.npz``: the params, read back with ``allow_pickle=False`` (no pickle anywhere).

Every file is written atomically (:mod:`compiler.runtime.module_cache`: a temporary file, then
``os.replace``) and the manifest last, so a directory with a manifest is complete. Every file gets the same
mode, ``0666`` less the process umask (what ``open()`` would give), not the temporary file's ``0600``.
This module reads and writes the files; :class:`~compiler.runtime.executor.CompiledModel` turns them into
a model. A missing or damaged file is a :class:`~compiler.errors.KilnError` naming the file and the
``kiln compile`` command that rewrites the directory.

Every file is checked against its sha256 in the manifest before anything reads or loads it, so a truncated,
edited or foreign file (a ``model.so`` from another build, say) is that clear error, never a crash while
loading it (``dlopen`` of a truncated library can end in SIGBUS) and never silently rebuilt: a damaged
directory says so, and ``kiln compile`` rewrites it. Directories of format version 1 (no file hashes) are
refused with the same hint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import KilnError
from compiler.runtime.module_cache import replacing

FORMAT_VERSION = 2  # 2: files_sha256 (every file hashed)
MANIFEST = "manifest.json"
PARAMS = "params.npz"
# What read_model and CompiledModel.load need from a manifest.
REQUIRED = (
    "name", "target", "kernels", "buffers", "launches", "inputs", "input_names", "outputs", "source",
    "source_sha256", "params", "files_sha256",
)  # fmt: skip


def file_mode() -> int:
    """The mode a new file gets in this process: ``0o666`` less the umask."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no portable way to read the umask without setting it
    os.umask(mask)
    return 0o666 & ~mask


def _write(path: Path, data: bytes | None = None, params: Mapping[int, np.ndarray] | None = None) -> None:
    """Write ``data`` (or ``params`` as an npz) to ``path`` atomically with :func:`file_mode`."""
    with replacing(path) as tmp:
        if params is not None:
            np.savez(tmp, **{f"p{i}": a for i, a in params.items()})
        else:
            tmp.write_bytes(data or b"")
        os.chmod(tmp, file_mode())


def recompile_hint(directory: Path, manifest: Mapping[str, Any] | None = None) -> str:
    """What to run to rewrite ``directory``: the ``kiln compile`` command, as exact as the manifest allows."""
    meta = (manifest or {}).get("meta") or {}
    source = meta.get("model_source") or meta.get("model") or "MODEL"
    shapes = meta.get("input_shapes") or {}
    target = (manifest or {}).get("target")
    parts = ["kiln compile", f"--model {source}"]
    if isinstance(shapes, dict):
        parts += [f"--input-shape {k}={'x'.join(str(d) for d in v)}" for k, v in shapes.items()]
    if isinstance(target, dict) and target.get("kind") not in (None, "cpu"):
        parts.append(f"--target {target['kind']}")
    parts.append(f"-o {directory}")
    return f"recompile it with `{' '.join(parts)}`"


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
    ``source_sha256``, ``params`` and ``files_sha256`` are added here. ``files`` are extra files
    (name -> bytes).
    """
    directory.mkdir(parents=True, exist_ok=True)
    data = source.encode()
    _write(directory / source_name, data)
    hashes = {}
    for name, content in (files or {}).items():
        _write(directory / name, content)
        hashes[name] = hashlib.sha256(content).hexdigest()
    _write(directory / PARAMS, params=params)
    hashes[PARAMS] = hashlib.sha256((directory / PARAMS).read_bytes()).hexdigest()
    full = {
        **manifest,
        "format": format_name(backend),
        "format_version": FORMAT_VERSION,
        "source": source_name,
        "source_sha256": hashlib.sha256(data).hexdigest(),
        "params": PARAMS,
        "files_sha256": hashes,
    }
    path = directory / MANIFEST
    _write(path, json.dumps(full, indent=2, sort_keys=True).encode())
    return path


def read_manifest(directory: Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` of ``directory`` (KilnError when it is missing or not JSON)."""
    path = directory / MANIFEST
    if not directory.is_dir():
        raise KilnError(f"{directory} is not a directory; compile a model into it with `kiln compile`")
    if not path.is_file():
        raise KilnError(
            f"{path} is missing: {directory} is not a complete compiled model; {recompile_hint(directory)}"
        )
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise KilnError(f"cannot read {path}: {exc.strerror or exc}; {recompile_hint(directory)}") from None
    except ValueError as exc:
        raise KilnError(f"{path} is damaged (not JSON: {exc}); {recompile_hint(directory)}") from None
    if not isinstance(manifest, dict):
        raise KilnError(f"{path} is damaged (not a JSON object); {recompile_hint(directory)}")
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
            f"{recompile_hint(directory, manifest)}"
        )
    hint = recompile_hint(directory, manifest)
    missing = [k for k in REQUIRED if k not in manifest]
    if missing:
        raise KilnError(f"{path} is damaged (no {', '.join(missing)}); {hint}")
    source_path = directory / str(manifest["source"])
    try:
        source = source_path.read_bytes()
    except FileNotFoundError:
        raise KilnError(f"{source_path} is missing; {hint}") from None
    except OSError as exc:
        raise KilnError(f"cannot read {source_path}: {exc.strerror or exc}; {hint}") from None
    if hashlib.sha256(source).hexdigest() != manifest["source_sha256"]:
        raise KilnError(f"{source_path} does not match its manifest (edited or damaged); {hint}")
    _check_files(directory, manifest, hint)
    params_path = directory / str(manifest["params"])
    try:
        with np.load(params_path, allow_pickle=False) as npz:
            params = {int(k[1:]): npz[k] for k in npz.files}
    except FileNotFoundError:
        raise KilnError(f"{params_path} is missing; {hint}") from None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise KilnError(f"{params_path} is damaged ({exc}); {hint}") from None
    return SavedModel(directory, m.group(1), manifest, source.decode(), params)


def _check_files(directory: Path, manifest: Mapping[str, Any], hint: str) -> None:
    """Every file named in ``files_sha256`` exists and has that sha256 (else a KilnError naming it)."""
    hashes = manifest["files_sha256"]
    if not isinstance(hashes, dict) or manifest["params"] not in hashes:
        raise KilnError(f"{directory / MANIFEST} is damaged (files_sha256 does not hash the params); {hint}")
    for name, expected in sorted(hashes.items()):
        path = directory / str(name)
        if Path(str(name)).name != name:
            raise KilnError(f"{directory / MANIFEST} is damaged (file name {name!r} in files_sha256); {hint}")
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except FileNotFoundError:
            raise KilnError(f"{path} is missing; {hint}") from None
        except OSError as exc:
            raise KilnError(f"cannot read {path}: {exc.strerror or exc}; {hint}") from None
        if digest != expected:
            raise KilnError(
                f"{path} does not match its manifest (truncated, damaged or from another build); {hint}"
            )
