"""Benchmark suites: which workloads `kiln bench` times, with which contenders, for how long.

Built-in suites:

* ``quick``: three small built-in models (softmax, layernorm, mlp), short rounds; finishes in well under two
  minutes on two cores (torch.compile's compilation is left out of it: it alone takes longer);
* ``zoo``: the built-in models the committed CPU table covers (softmax_large, rmsnorm, layernorm, bias_gelu,
  matmul, mlp, encoder_layer);
* ``onnx DIR``: every ``*.onnx`` file of a folder (static shapes; onnxruntime runs the file itself).

A suite file (TOML) names its own::

    name = "mine"                      # optional, default: the file's stem
    contenders = ["kiln default", "onnxruntime", "numpy"]   # optional, default: all for the target
    rounds = 5                         # optional
    min_time = 0.2                     # seconds per contender per round, optional

    [[workload]]
    model = "layernorm"                # a built-in model ...

    [[workload]]
    model = "nets/bert.onnx"           # ... or an ONNX file (relative to the suite file)
    name = "bert"                      # optional
    input_shapes = { input_ids = [1, 128] }   # static shapes for dynamic ONNX inputs
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compiler.errors import KilnError


@dataclass(frozen=True)
class Workload:
    """One thing to time: a built-in model name or an ONNX file, with static input shapes."""

    name: str
    model: str
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def onnx_path(self) -> Path | None:
        return Path(self.model) if self.model.endswith(".onnx") else None


@dataclass(frozen=True)
class Suite:
    """A named list of workloads; ``contenders`` None means every contender of the target."""

    name: str
    workloads: tuple[Workload, ...]
    contenders: tuple[str, ...] | None = None
    rounds: int = 5
    min_time: float = 0.2


ZOO_MODELS = ("softmax_large", "rmsnorm", "layernorm", "bias_gelu", "matmul", "mlp", "encoder_layer")
QUICK_MODELS = ("softmax", "layernorm", "mlp")
QUICK_CONTENDERS = ("kiln default", "kiln tuned", "numpy", "onnxruntime", "torch eager")
BUILTIN = ("quick", "zoo", "onnx")


def builtin_suite(name: str, folder: str | None = None) -> Suite:
    """The built-in suite ``name`` (``onnx`` takes the folder of ONNX files)."""
    if name == "quick":
        return Suite("quick", tuple(Workload(m, m) for m in QUICK_MODELS), QUICK_CONTENDERS, 5, 0.05)
    if name == "zoo":
        return Suite("zoo", tuple(Workload(m, m) for m in ZOO_MODELS), None, 5, 0.2)
    if name == "onnx":
        if folder is None:
            raise KilnError("--suite onnx needs a folder of ONNX files: --suite onnx DIR")
        path = Path(folder)
        if not path.is_dir():
            raise KilnError(f"--suite onnx {folder}: not a folder")
        files = sorted(path.glob("*.onnx"))
        if not files:
            raise KilnError(f"--suite onnx {folder}: no *.onnx file in that folder")
        return Suite(f"onnx:{path.name}", tuple(Workload(f.stem, str(f)) for f in files), None, 5, 0.2)
    raise KilnError(f"unknown suite {name!r}; built-in suites: {', '.join(BUILTIN)}, or a suite file (.toml)")


def resolve_suite(spec: list[str]) -> Suite:
    """``--suite`` as given: ``quick``, ``zoo``, ``onnx DIR`` or ``FILE.toml``."""
    if not spec:
        raise KilnError("--suite needs a value: quick, zoo, onnx DIR or FILE.toml")
    head, rest = spec[0], spec[1:]
    if head.endswith(".toml"):
        if rest:
            raise KilnError(f"--suite {head} takes no more values, got {' '.join(rest)}")
        return load_suite_file(Path(head))
    if head == "onnx":
        if len(rest) != 1:
            raise KilnError("--suite onnx needs exactly one folder: --suite onnx DIR")
        return builtin_suite("onnx", rest[0])
    if rest:
        raise KilnError(f"--suite {head} takes no more values, got {' '.join(rest)}")
    return builtin_suite(head)


def load_suite_file(path: Path) -> Suite:
    """Read a TOML suite file; every problem is a KilnError naming the file and the key."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise KilnError(f"cannot read suite file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise KilnError(f"suite file {path} is not valid TOML: {exc}") from None
    known = {"name", "contenders", "rounds", "min_time", "workload"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise KilnError(
            f"suite file {path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    items = data.get("workload")
    if not isinstance(items, list) or not items:
        raise KilnError(f"suite file {path}: needs at least one [[workload]] table with a model")
    workloads = [_workload(path, i, item) for i, item in enumerate(items)]
    names = [w.name for w in workloads]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise KilnError(f"suite file {path}: workload names must be unique, repeated: {', '.join(dup)}")
    contenders = data.get("contenders")
    if contenders is not None and (
        not isinstance(contenders, list) or not all(isinstance(c, str) for c in contenders) or not contenders
    ):
        raise KilnError(f"suite file {path}: contenders must be a non-empty list of names")
    rounds = data.get("rounds", 5)
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 2:
        raise KilnError(f"suite file {path}: rounds must be an integer of at least 2, got {rounds!r}")
    min_time = data.get("min_time", 0.2)
    if not isinstance(min_time, int | float) or isinstance(min_time, bool) or min_time <= 0:
        raise KilnError(f"suite file {path}: min_time must be a positive number of seconds, got {min_time!r}")
    return Suite(
        str(data.get("name") or path.stem),
        tuple(workloads),
        tuple(contenders) if contenders else None,
        rounds,
        float(min_time),
    )


def _workload(path: Path, index: int, item: Any) -> Workload:
    where = f"suite file {path}: workload {index + 1}"
    if not isinstance(item, dict) or not isinstance(item.get("model"), str):
        raise KilnError(f"{where} needs model = a built-in model name or an ONNX file")
    unknown = sorted(set(item) - {"model", "name", "input_shapes"})
    if unknown:
        raise KilnError(f"{where}: unknown key(s) {', '.join(unknown)}; known: input_shapes, model, name")
    model = item["model"]
    if model.endswith(".onnx"):
        file = Path(model) if Path(model).is_absolute() else path.parent / model
        if not file.is_file():
            raise KilnError(f"{where}: ONNX file {file} does not exist")
        model = str(file)
    shapes: dict[str, tuple[int, ...]] = {}
    for key, dims in (item.get("input_shapes") or {}).items():
        if not isinstance(dims, list) or not all(isinstance(d, int) and d > 0 for d in dims):
            raise KilnError(f"{where}: input_shapes.{key} must be a list of positive integers, got {dims!r}")
        shapes[key] = tuple(dims)
    name = item.get("name") or Path(model).stem
    return Workload(str(name), model, shapes)
