"""The optional compiled build of the origin's hot modules (mypyc), with PRISM_COMPILE=1.

Without it this is a plain setuptools build: the metadata is all in pyproject.toml and
every module ships as Python. With it, the modules listed in pyproject.toml's
``[tool.prism.compiled]`` are compiled by mypyc into C extensions beside their ``.py``
files (Python imports an extension before a source module of the same name):
``PRISM_COMPILE=1 python setup.py build_ext --inplace`` builds them in the checkout. The
edge never loads them: its bundle copies only ``.py`` files.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from setuptools import setup


def compiled_modules() -> list[str]:
    """The source files to compile, relative to this folder."""
    pyproject = tomllib.loads((Path(__file__).parent / "pyproject.toml").read_text())
    return list(pyproject["tool"]["prism"]["compiled"]["modules"])


def _extensions() -> list[object]:
    if os.environ.get("PRISM_COMPILE") != "1":
        return []
    from mypyc.build import mypycify  # mypy's wheel (the dev extra)

    return list(mypycify(compiled_modules(), opt_level="3", group_name="prism._compiled"))


setup(ext_modules=_extensions())
