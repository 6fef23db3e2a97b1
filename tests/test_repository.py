"""The repository holds sources only: nothing it ignores is tracked, no link points outside it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout"
)


def _git(*args: str) -> list[str]:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_no_tracked_file_is_one_the_repository_ignores() -> None:
    # e.g. a worktree's node_modules link or a merge's .orig file, committed by mistake
    assert _git("ls-files", "--cached", "--ignored", "--exclude-standard") == []


def test_no_tracked_symlink() -> None:
    # a committed link resolves into the machine it was made on, not into a clone
    links = [line.split("\t", 1)[1] for line in _git("ls-files", "-s") if line.startswith("120000")]
    assert links == []
