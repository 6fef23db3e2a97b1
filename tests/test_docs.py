"""The docs stay true to the repository: the map at the start of docs/architecture.md names
only paths that exist and leaves out no package, every relative link in README.md and
docs/*.md reaches a file (and a heading, when it names one), and the README lists every
docs page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
MAP_BEGIN, MAP_END = "<!-- map:begin -->", "<!-- map:end -->"
# The top-level packages whose subpackages the map must name, one line each.
MAPPED_PACKAGES = ("prism", "edge", "origin", "deploy")

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_BACKTICKED_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*(?:/|\.py))`")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)


def the_map() -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    if MAP_BEGIN not in text or MAP_END not in text:
        return ""
    return text.split(MAP_BEGIN, 1)[1].split(MAP_END, 1)[0]


def tree_lines() -> list[str]:
    """The map's tree: the lines of its first fenced block, one package each."""
    found = re.search(r"```[^\n]*\n(.*?)\n```", the_map(), re.S)
    return [line for line in found.group(1).splitlines() if line.strip()] if found else []


def map_paths() -> list[str]:
    """Every path the map names: each tree line's first word, and each backticked path
    ending in ``/`` or ``.py`` in the request path below the tree."""
    named = {line.split()[0] for line in tree_lines()}
    named.update(_BACKTICKED_PATH.findall(_FENCE.sub("", the_map())))
    return sorted(named)


def docs_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    """The page's links that are not to another site, outside code."""
    prose = _CODE_SPAN.sub("", _FENCE.sub("", page.read_text(encoding="utf-8")))
    return [
        target
        for target in _LINK.findall(prose)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I)  # https:, mailto:, …
    ]


def test_the_map_is_there_and_one_screen() -> None:
    assert the_map(), f"docs/architecture.md has no {MAP_BEGIN} … {MAP_END} map"
    assert len(the_map().strip().splitlines()) <= 55, "the map no longer fits one screen"
    assert len(map_paths()) >= 20


@pytest.mark.parametrize("path", map_paths())
def test_every_path_the_map_names_exists(path: str) -> None:
    target = REPO / path
    if path.endswith("/"):
        assert target.is_dir(), f"the map names {path}, which is not a directory"
    else:
        assert target.is_file(), f"the map names {path}, which is not a file"


@pytest.mark.parametrize("package", MAPPED_PACKAGES)
def test_the_map_names_every_subpackage(package: str) -> None:
    named = set(map_paths())
    subpackages = sorted(
        f"{child.relative_to(REPO).as_posix()}/"
        for child in (REPO / package).iterdir()
        if child.is_dir() and child.name != "__pycache__" and any(child.glob("*.py"))
    )
    missing = [path for path in subpackages if path not in named]
    assert f"{package}/" in named
    assert not missing, f"the map in docs/architecture.md leaves out {missing}"


@pytest.mark.parametrize("page", docs_pages(), ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_relative_link_reaches_a_file(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        reached = (page.parent / path).resolve() if path else page
        if not reached.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and reached.suffix == ".md" and anchor not in anchors(reached):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_every_docs_page_has_a_title() -> None:
    untitled = [
        page.name
        for page in sorted((REPO / "docs").glob("*.md"))
        if not page.read_text(encoding="utf-8").startswith("# ")
    ]
    assert not untitled


def test_the_readme_links_every_docs_page() -> None:
    linked = {
        (REPO / target.partition("#")[0]).resolve() for target in relative_links(REPO / "README.md")
    }
    unlisted = [
        page.name for page in sorted((REPO / "docs").glob("*.md")) if page.resolve() not in linked
    ]
    assert not unlisted, f"README.md does not link {unlisted}"


def test_the_readme_starts_with_the_two_commands() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert lines[2] == "```sh"
    assert lines[3].startswith("make dev ") and lines[4].startswith("make test ")
    assert lines[5] == "```"
