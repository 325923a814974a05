"""Lockstep (SIMT) interpretation of GPU-bound loops; completed with the CUDA target."""

from __future__ import annotations

from compiler.loopir.stmt import For


def compile_thread_loop(loop: For):
    from compiler.loopir.interp import InterpError

    raise InterpError(f"thread-bound loop {loop.var.name} ({loop.thread}) needs the SIMT interpreter")
