"""Saving and loading a CompiledModel: a directory with a JSON manifest, the C source, the shared object
and an ``.npz`` of params. No pickle anywhere: params are loaded with ``allow_pickle=False``.

Loading tries the saved shared object only when it was built on a CPU like this one (same target key and
features: ``-march=native`` code may not run elsewhere) from the same source; otherwise, or when it does
not load, the model is rebuilt from ``model.c`` through the kernel cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from compiler.backends.cpu import gcc as cbuild
from compiler.errors import CompileError, KilnError
from compiler.runtime.memory_plan import BufferSpec, Launch
from compiler.target import Target

if TYPE_CHECKING:
    from compiler.runtime.executor import CompiledModel

FORMAT = "kiln-cpu-model"
FORMAT_VERSION = 1


def _host() -> dict[str, Any]:
    t = Target.host()
    return {"key": t.key, "features": list(t.features)}


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def save(model: CompiledModel, directory: Path) -> Path:
    """Write ``model`` to ``directory`` (created if missing); returns the manifest path."""
    directory.mkdir(parents=True, exist_ok=True)
    model._ensure_built()
    assert model.library is not None
    source = model.source.encode()
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "name": model.name,
        "target": model.target.to_json(),
        "built_on": _host(),
        "compiler": cbuild.compiler_id(),
        "flags": list(cbuild.FLAGS),
        "source": "model.c",
        "source_sha256": hashlib.sha256(source).hexdigest(),
        "library": "model.so",
        "params": "params.npz",
        "num_threads": model.num_threads,
        "kernels": [k.to_json() for k in model.kernels],
        "buffers": [b.to_json() for b in model.buffers],
        "launches": [launch.to_json() for launch in model.launches],
        "inputs": model.inputs,
        "input_names": model.input_names,
        "outputs": model.outputs,
        "memory_plan": model.plan.summary(),
        "meta": model.meta,
    }
    _write(directory / "model.c", source)
    tmp_so = directory / ".model.so.tmp"
    shutil.copyfile(model.library.path, tmp_so)
    os.replace(tmp_so, directory / "model.so")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".params-", suffix=".npz")
    os.close(fd)
    np.savez(tmp, **{f"p{i}": a for i, a in model.params.items()})
    os.replace(tmp, directory / "params.npz")
    _write(directory / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode())
    return directory / "manifest.json"


def load(directory: Path, num_threads: int | None = None) -> CompiledModel:
    """Load a model saved by :func:`save`."""
    from compiler.runtime.executor import CompiledModel, KernelInfo

    path = directory / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KilnError(f"cannot read compiled model manifest {path}: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise KilnError(f"{path} is not a Kiln CPU model (format {manifest.get('format')!r})")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise KilnError(
            f"{path} has format version {version!r}; this Kiln reads version {FORMAT_VERSION}: "
            "recompile the model"
        )
    source_bytes = (directory / manifest["source"]).read_bytes()
    if hashlib.sha256(source_bytes).hexdigest() != manifest["source_sha256"]:
        raise KilnError(f"{directory / manifest['source']} does not match its manifest (edited or corrupted)")
    source = source_bytes.decode()
    with np.load(directory / manifest["params"], allow_pickle=False) as npz:
        params = {int(k[1:]): npz[k] for k in npz.files}
    library = None
    so = directory / manifest["library"]
    same_host = manifest.get("built_on") == _host() and manifest.get("compiler") == cbuild.compiler_id()
    if same_host and so.exists():
        try:
            library = cbuild.KernelLibrary(so)
        except CompileError:
            library = None
    if library is None:
        library = cbuild.build(source)
    return CompiledModel(
        name=manifest["name"],
        target=Target.from_json(manifest["target"]),
        source=source,
        kernels=[KernelInfo.from_json(k) for k in manifest["kernels"]],
        buffers=[BufferSpec.from_json(b) for b in manifest["buffers"]],
        launches=[Launch(x["kernel"], x["args"]) for x in manifest["launches"]],
        params=params,
        inputs=manifest["inputs"],
        input_names=manifest["input_names"],
        outputs=manifest["outputs"],
        num_threads=num_threads,
        library=library,
        meta=manifest.get("meta") or {},
    )
