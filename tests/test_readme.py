"""The README's quick start, run as written: a fresh copy of the working tree (what a clone holds), a fresh
virtualenv without the system's site packages, and every fenced block that follows a
``<!-- readme-test -->`` marker, in order: ``bash`` blocks line by line with ``bash`` (so ``pip install
-e .`` is the user install into that virtualenv and ``kiln`` is its console script), ``python`` blocks as a
script run by the virtualenv's Python. Every command runs in the copy's root, as a user who just cloned
would run it, and must exit with status 0.

``pip`` reaches the package index configured for this machine (CI has one); its cache makes later runs
fast. The test also checks what the user install is: no dev tools and no ``onnx`` until the README installs
the ``onnx`` extra.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = "<!-- readme-test -->"
BLOCK = re.compile(re.escape(MARKER) + r"\s*\n```(bash|python)\n(.*?)\n```", re.S)
COMMAND_TIMEOUT_S = 600


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """The marked blocks of ``text``: (language, code), in order."""
    blocks = [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]
    if text.count(MARKER) != len(blocks):
        raise AssertionError(f"every {MARKER} marker must be followed by a ```bash or ```python block")
    return blocks


def test_readme_blocks_are_found() -> None:
    """The parser sees the quick start, its user install first, and a Python block."""
    blocks = readme_blocks(README.read_text())
    assert blocks and blocks[0][0] == "bash"
    first = [line for line in blocks[0][1].splitlines() if line.strip()]
    assert first[0].split("#")[0].split() == ["pip", "install", "-e", "."]
    assert any(lang == "python" for lang, _ in blocks)
    with pytest.raises(AssertionError, match="must be followed"):
        readme_blocks(f"{MARKER}\n\n```text\nkiln models\n```\n")


def _copy_tree(dest: Path) -> None:
    """The working tree's files a clone would hold (tracked and untracked, not ignored) copied to ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():  # a tracked file deleted in the working tree is not there
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _run(command: list[str] | str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    shown = command if isinstance(command, str) else " ".join(command)
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            shell=isinstance(command, str),
            executable="/bin/bash" if isinstance(command, str) else None,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"README command ran past {COMMAND_TIMEOUT_S} s: {shown}")
    if done.returncode != 0:
        pytest.fail(
            f"README command failed with status {done.returncode}: {shown}\n"
            f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
        )
    return done


def _importable(python: Path, module: str, env: dict[str, str], cwd: Path) -> bool:
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([str(python), "-c", code], env=env, cwd=cwd).returncode == 0


@pytest.mark.slow
def test_readme_quick_start_runs_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    clone, venv = tmp_path / "kiln", tmp_path / "venv"
    clone.mkdir()
    _copy_tree(clone)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bindir = venv / "bin"
    python = bindir / "python"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "KILN_DB", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    env.update(
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        KILN_CACHE_DIR=str(tmp_path / "cache"),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    # the virtualenv sees none of this environment's packages
    assert not _importable(python, "numpy", env, clone)

    installed_user = False
    for i, (lang, code) in enumerate(readme_blocks((clone / "README.md").read_text())):
        if lang == "python":
            script = clone / f"readme_block_{i}.py"
            script.write_text(textwrap.dedent(code) + "\n")
            _run([str(python), script.name], clone, env)
            continue
        for line in code.splitlines():
            command = line.split("#", 1)[0].strip()
            if not command:
                continue
            done = _run(command, clone, env)
            if command == "pip install -e .":  # the user install: runtime dependencies only
                installed_user = True
                assert (bindir / "kiln").exists()
                for extra in ("pytest", "ruff", "onnx", "onnxruntime"):
                    assert not _importable(python, extra, env, clone), f"{extra} came with the user install"
            if command == "kiln --version":
                assert re.fullmatch(r"kiln \d+\.\d+\.\S+\n", done.stdout), done.stdout
    assert installed_user
    assert (clone / "kiln.db").is_file() and (clone / "out" / "manifest.json").is_file()
