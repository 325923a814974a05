"""The ``kiln`` backend of ``torch.compile`` (entry point ``torch_dynamo_backends``), with a tuning database.

``torch.compile(model, backend="kiln", dynamic=False, options={...})`` captures the model with Dynamo and
hands each FX graph to :func:`kiln_backend`: the graph is lowered and converted by
:func:`compiler.frontend.torch.kiln_backend` (which never sees the database: ``compiler`` does not import
``tuner``), and every group uses the best valid record of the database, else its sketch's default.

Options:
- ``db``: a database URL (default ``$KILN_DB``; with neither, every group uses its default schedule);
- ``target``: a target text such as ``cpu`` (default: ``cuda`` for CUDA inputs, else ``cpu``);
- ``tune``: ``"off"`` (default) or a number of measured trials: each new graph's tasks are tuned into the
  database on the first call, before it is compiled (``db`` or ``$KILN_DB`` needed).

``tune_module(module, example_inputs, db, budget)`` tunes a torch module's tasks ahead of time (the same
capture and conversion, then :func:`tuner.api.tune` per Kiln graph) and returns one summary per graph.

``load_torch_model("package.module:function")`` is ``--model package.module:function`` of the CLI
(``kiln tune``, ``kiln compile``, ``kiln show``): the function returns ``(module, example_inputs)``, and the
module in eval mode must make exactly one Kiln graph (no eager fallback).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from compiler.errors import KilnError
from compiler.frontend.torch import capture_graphs
from compiler.frontend.torch import kiln_backend as convert_and_compile
from compiler.graph import Graph
from compiler.target import Target
from db.database import TuningDatabase
from tuner.api import TuneSummary, tune
from tuner.measure import Measurer
from tuner.records import database_config_source
from tuner.scheduler import Budget

OPTIONS = ("db", "target", "tune")


def _budget(value: Any) -> int | Budget | None:
    """The ``tune`` option as a number of trials or a Budget (None: off); one clear error for anything
    else."""
    if value is None or value == "off" or value is False:
        return None
    if isinstance(value, Budget):
        return value
    try:
        trials = int(value)
    except (TypeError, ValueError):
        raise KilnError(f"kiln backend option tune={value!r}: use 'off' or a number of trials") from None
    if trials < 1:
        raise KilnError(f"kiln backend option tune={value!r}: a tuning budget needs at least 1 trial")
    return trials


@contextlib.contextmanager
def _database(url: str | None, create: bool) -> Iterator[TuningDatabase | None]:
    url = url or os.environ.get("KILN_DB")
    if url is None:
        yield None
        return
    with TuningDatabase.open(url, create=create) as db:
        yield db


def kiln_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: dict[str, Any] | None = None,
    summaries: list[TuneSummary] | None = None,
    measurer: Measurer | None = None,
    on_model: Callable[[Graph, Any], None] | None = None,
    **_: Any,
) -> Callable[..., Any]:
    """A Dynamo backend: Kiln kernels with the database's best records (see the module doc). For Python
    callers (``functools.partial``): ``summaries`` collects the summary of every tuning run, ``measurer``
    replaces the local one while tuning, ``on_model`` is called with each Kiln graph and compiled model."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise KilnError(f"unknown kiln backend option(s) {unknown}; the options are {', '.join(OPTIONS)}")
    trials = _budget(options.get("tune", "off"))
    if trials is not None and not (options.get("db") or os.environ.get("KILN_DB")):
        raise KilnError("kiln backend option tune needs a database: options={'db': URL} or $KILN_DB")
    inner: dict[str, Any] = {"on_model": on_model}
    if options.get("target") is not None:
        inner["target"] = Target.parse(options["target"])
    with _database(options.get("db"), create=trials is not None) as db:
        if db is not None:
            inner["configs"] = database_config_source(db)
        if trials is not None:

            def on_graph(graph: Graph, target: Target) -> None:
                summary = tune(graph, target, db, trials, measurer=measurer, time_model=False)
                if summaries is not None:
                    summaries.append(summary)

            inner["on_graph"] = on_graph
        return convert_and_compile(gm, example_inputs, options=inner)


def tune_module(
    module: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    db: str,
    budget: int | Budget = 64,
    target: str | None = None,
    measurer: Measurer | None = None,
) -> list[TuneSummary]:
    """Tune the Kiln tasks of ``module`` on ``example_inputs`` (static shapes) into the database at ``db``
    with ``budget`` (measured trials, or a :class:`~tuner.scheduler.Budget`) per captured graph; returns one
    summary per graph Kiln compiled.
    ``measurer`` replaces the local builder and runner of the target."""
    summaries: list[TuneSummary] = []
    options = {"db": db, "tune": budget, "target": target}
    backend = functools.partial(kiln_backend, options=options, summaries=summaries, measurer=measurer)
    compiled = torch.compile(module, backend=backend, dynamic=False)
    with torch.no_grad():
        compiled(*example_inputs)
    if not summaries:
        raise KilnError(
            "torch.compile handed Kiln no graph to tune (the module ran in eager: Dynamo's recompile "
            "limit for its forward may be reached; torch._dynamo.reset() clears it)"
        )
    return summaries


def load_torch_model(spec: str) -> Graph:
    """The Kiln graph of the torch model ``spec`` names: ``package.module:function``, a function that
    returns ``(nn.Module, example_inputs)`` (imported with the current directory on the path)."""
    modname, _, attr = spec.partition(":")
    if not modname or not attr:
        raise KilnError(f"--model {spec!r}: a torch model is given as package.module:function")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(modname)
    except ImportError as exc:
        raise KilnError(f"--model {spec}: cannot import {modname}: {exc}") from None
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise KilnError(f"--model {spec}: {modname} has no function {attr}")
    made = fn()
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module)):
        raise KilnError(f"--model {spec}: {attr}() must return (torch.nn.Module, example_inputs)")
    module, inputs = made
    inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    graphs = capture_graphs(module.eval(), inputs)
    if len(graphs) != 1:
        raise KilnError(
            f"--model {spec}: the module makes {len(graphs)} Kiln graphs (some ops run in eager, or Dynamo "
            "split it); tune it with tuner.torch_backend.tune_module"
        )
    graph = graphs[0]
    graph.name = spec.replace(":", ".")
    return graph
