"""The on-disk cache of built kernel modules shared by every backend, and compiler error messages.

A backend compiles generated source into a loadable module (gcc: a shared object; NVRTC: a cubin) and
keeps it in a :class:`ModuleCache`: a directory (``$KILN_CACHE_DIR``, default ``~/.cache/kiln``, plus an
optional sub-directory per backend) of files named by a key. The key (:func:`cache_key`) is the sha256 of
the source, the compiler options, whatever else changes the built code (compiler version, host CPU, GPU
arch, the backend's codegen version) and :data:`CACHE_VERSION`. Entries are written atomically: a
temporary file in the cache directory, then ``os.replace`` (:func:`write_atomic`, :meth:`ModuleCache.stage`),
so processes that build the same module at the same time each get a complete file; :func:`replacing`
lends a temporary path to code that writes a file itself, and :func:`write_first` keeps the first of
several writers' files (the host probes' results).

A compiler failure is reported by :func:`compile_error_message`: ``<tool> failed to compile kernel(s) A, B``
followed by the compiler's error lines, the kernels named from the line numbers of the errors and the
:func:`kernel_spans` of the source; :func:`errors_by_kernel` splits the error lines by kernel (a builder
that compiles several candidates in one translation unit blames each for its own lines).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

CACHE_ENV = "KILN_CACHE_DIR"
CACHE_VERSION = "module-cache-1"  # bump when what a cache entry holds changes meaning
MAX_ERROR_LINES = 30
MAX_LOG_CHARS = 3000


def cache_root() -> Path:
    """``$KILN_CACHE_DIR`` or ``~/.cache/kiln`` (read on every call, so tests can point it elsewhere)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "kiln")


def cache_key(source: str, options: tuple[str, ...] = (), *extra: str) -> str:
    """sha256 (hex) of ``source``, the compiler ``options``, ``extra`` and :data:`CACHE_VERSION`."""
    h = hashlib.sha256()
    for part in (source, " ".join(options), *extra, CACHE_VERSION):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix) to write into: moved onto ``path`` with
    ``os.replace`` when the block finishes, removed when it raises."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=path.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_first(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` unless a file is there already: through a temporary file hard-linked into
    place, so the first of several concurrent writers wins and every process then reads that one answer
    (a host probe's result); the temporary file is always removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        os.unlink(tmp)


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory and ``os.replace``."""
    with replacing(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return Path(path)


class ModuleCache:
    """One directory of built modules: ``<root>/<subdir>/<key[:32]><suffix>``.

    ``subdir`` separates backends whose files could otherwise share a name ("" for the CPU's ``.so`` and
    ``.c``, "cuda" for cubins). The directory is resolved on every use, so ``$KILN_CACHE_DIR`` may change.
    """

    def __init__(self, subdir: str = "") -> None:
        self.subdir = subdir

    @property
    def directory(self) -> Path:
        """The cache directory (created if missing)."""
        d = cache_root() / self.subdir if self.subdir else cache_root()
        d.mkdir(parents=True, exist_ok=True)
        return d

    def path(self, key: str, suffix: str) -> Path:
        """Where the entry ``key`` with file suffix ``suffix`` lives (it may not exist)."""
        return self.directory / f"{key[:32]}{suffix}"

    def get(self, key: str, suffix: str) -> Path | None:
        """The entry's path when it is in the cache, else None."""
        p = self.path(key, suffix)
        return p if p.exists() else None

    def put(self, key: str, suffix: str, data: bytes) -> Path:
        """Store ``data`` as the entry (atomically) and return its path."""
        return write_atomic(self.path(key, suffix), data)

    @contextlib.contextmanager
    def stage(self, key: str, *suffixes: str) -> Iterator[list[Path]]:
        """Temporary paths in the cache directory, one per suffix, for a compiler to write into.

        When the block finishes, each temporary file is moved to its entry in the order given (so put the
        file whose presence means "built" last); when it raises, the temporary files are removed and
        nothing is added to the cache.
        """
        d = self.directory
        temps: list[Path] = []
        try:
            for suffix in suffixes:
                fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}-", suffix=suffix, dir=d)
                os.close(fd)
                temps.append(Path(tmp))
            yield temps
            for tmp, suffix in zip(temps, suffixes):
                os.replace(tmp, self.path(key, suffix))
        finally:
            for tmp in temps:
                if tmp.exists():
                    tmp.unlink()


def kernel_spans(source: str, kernel_pattern: str) -> list[tuple[int, str]]:
    """(first line, name) of every kernel of ``source``: lines where ``kernel_pattern`` (a regex whose
    group 1 is the kernel's name) is found, in order."""
    spans = []
    for i, line in enumerate(source.splitlines(), start=1):
        m = re.search(kernel_pattern, line)
        if m:
            spans.append((i, m.group(1)))
    return spans


def errors_by_kernel(
    source: str, log: str, *, kernel_pattern: str, error_pattern: str
) -> dict[str, list[str]]:
    """The compiler's error lines of ``log`` grouped by the kernel they fall in, in order of first error.

    ``error_pattern`` is a regex found in a log line that reports an error, its group 1 the line number in
    ``source``; the kernel whose :func:`kernel_spans` span holds that line owns it ("prelude" before the
    first kernel). Lines that mention "error" without a line number belong to no kernel and are left out.
    """
    spans = kernel_spans(source, kernel_pattern)
    owned: dict[str, list[str]] = {}
    for line in log.splitlines():
        m = re.search(error_pattern, line)
        if m:
            lineno = int(m.group(1))
            owner = [n for start, n in spans if start <= lineno]
            owned.setdefault(owner[-1] if owner else "prelude", []).append(line.strip())
    return owned


def compile_error_message(
    tool: str,
    source: str,
    log: str,
    *,
    kernel_pattern: str,
    error_pattern: str,
    where: str = "",
) -> str:
    """``<tool> failed to compile kernel(s) A, B<where>:`` and the error lines of the compiler's ``log``.

    The kernels are named by :func:`errors_by_kernel`. Lines that mention "error" (or match
    ``error_pattern``) are quoted (at most :data:`MAX_ERROR_LINES`), else the end of the log.
    """
    names = list(errors_by_kernel(source, log, kernel_pattern=kernel_pattern, error_pattern=error_pattern))
    quoted = [line.strip() for line in log.splitlines() if "error" in line or re.search(error_pattern, line)]
    text = "\n".join(quoted[:MAX_ERROR_LINES]) or log.strip()[-MAX_LOG_CHARS:]
    what = ", ".join(names) if names else "(unknown kernel)"
    return f"{tool} failed to compile kernel(s) {what}{where}:\n{text}"
