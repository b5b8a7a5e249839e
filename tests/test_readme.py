"""The README and the docs pages against the tree: the layout names what exists and
everything that exists, the links resolve, and the set-up commands are the ones CI runs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
CI_SCRIPT = REPO_ROOT / ".ci" / "run"
MAX_README_LINES = 450
TEST_COMMAND = "python -m pytest"
# The pages whose links are checked: the README, the docs pages and the pages beside the code.
PAGES = [README, *sorted((REPO_ROOT / "docs").glob("*.md")), REPO_ROOT / "kernels" / "README.md",
         REPO_ROOT / "tests" / "README.md"]

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")


def outside_code(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (code blocks become empty lines)."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            lines.append("")
        else:
            lines.append("" if in_fence else line)
    return lines


def section(text: str, title: str) -> str:
    """The text under the level-2 heading `title`, up to the next level-2 heading."""
    lines, found, in_fence = [], False, False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        if not in_fence and line.startswith("## "):
            if found:
                break
            found = line[3:].strip() == title
            continue
        if found:
            lines.append(line)
    assert found, f"no '## {title}' section"
    return "\n".join(lines)


def code_blocks(text: str) -> list[list[str]]:
    """The fenced code blocks of `text`, each as its lines."""
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a page (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    result = set()
    for line in outside_code(page.read_text(encoding="utf-8")):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def relative_links(page: Path) -> list[str]:
    """The page's link and image targets that are not URLs (outside code)."""
    targets = []
    for line in outside_code(page.read_text(encoding="utf-8")):
        for target in LINK.findall(INLINE_CODE.sub("code", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                targets.append(target)
    return targets


def layout_paths(text: str, where: str) -> list[str]:
    """The paths a layout block names: one entry per line, two spaces of indent per level
    below its folder, the name first (a folder ends in '/'), then what it is."""
    blocks = code_blocks(text)
    assert len(blocks) == 1, f"{where}: expected one code block with the layout, found {len(blocks)}"
    paths: list[str] = []
    folders: list[str] = []  # folders[d] is the folder of an entry at depth d + 1
    for line in blocks[0]:
        if not line.strip():
            continue
        match = re.match(r"^( *)(\S+)(?:\s{2,}\S.*)?$", line)
        assert match, f"{where}: cannot read the layout line {line!r} (name, two spaces, description)"
        depth, name = len(match.group(1)) // 2, match.group(2)
        assert len(match.group(1)) % 2 == 0 and depth <= len(folders), \
            f"{where}: the layout line {line!r} is not indented two spaces below a folder"
        assert "/" in name or "." in name, f"{where}: {name!r} in the layout is not a file or folder name"
        del folders[depth:]
        path = "".join(folders) + name
        paths.append(path.rstrip("/"))
        if name.endswith("/"):
            folders.append(name)
    return paths


def readme_text() -> str:
    return README.read_text(encoding="utf-8")


def linked_pages(page: Path) -> list[Path]:
    """The Markdown pages in this repository that `page` links to."""
    result = []
    for target in relative_links(page):
        file_part = target.split("#", 1)[0]
        if file_part.endswith(".md"):
            linked = (page.parent / file_part).resolve()
            if linked.is_file() and linked not in result:
                result.append(linked)
    return result


def documented_paths() -> set[str]:
    """What the README's architecture sketch and the layout of the pages it links name."""
    named = set(layout_paths(section(readme_text(), "Architecture"), "README.md, Architecture"))
    for page in linked_pages(README):
        text = page.read_text(encoding="utf-8")
        if re.search(r"^## Layout\s*$", text, re.MULTILINE):
            named |= set(layout_paths(section(text, "Layout"), f"{page.name}, Layout"))
    return named


def setup_commands() -> list[str]:
    blocks = code_blocks(section(readme_text(), "Set up"))
    assert blocks, "the README's Set up section has no code block"
    return [line.strip() for line in blocks[0] if line.strip() and not line.strip().startswith("#")]


def test_the_readme_stays_short():
    lines = readme_text().count("\n") + 1
    assert lines < MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/ (at most {MAX_README_LINES})"


def test_every_path_the_readme_and_the_layout_page_name_exists():
    missing = sorted(path for path in documented_paths() if not (REPO_ROOT / path).exists())
    assert not missing, f"the layout names paths that do not exist: {missing}"


def test_the_layout_reader_builds_paths_from_the_indentation():
    text = "```text\nmain.py   the entry\nengine/   core\n  data/   data\n    corpus.py  the corpus\n" \
           "  config.py  configs\nkernels/  sources\n```\n"
    assert layout_paths(text, "example") == ["main.py", "engine", "engine/data", "engine/data/corpus.py",
                                              "engine/config.py", "kernels"]
    with pytest.raises(AssertionError, match="not indented"):
        layout_paths("```\nengine/  core\n      deep.py  too deep\n```\n", "example")


def package_children(folder: str) -> list[str]:
    """The modules and packages directly under `folder` (relative to the repository)."""
    children = []
    for child in sorted((REPO_ROOT / folder).iterdir()):
        if child.name.startswith("__"):  # __init__.py, __pycache__
            continue
        if (child.is_file() and child.suffix == ".py") or (child / "__init__.py").is_file():
            children.append(f"{folder}/{child.name}")
    return children


@pytest.mark.parametrize("folder", ["engine", "gui"])
def test_every_package_and_module_directly_under_engine_and_gui_is_documented(folder):
    named = documented_paths()
    missing = [path for path in package_children(folder) if path not in named]
    assert not missing, (f"not in the README's architecture or docs/architecture.md's layout: {missing}; "
                         "add a line for each")


@pytest.mark.parametrize("folder", ["engine", "gui"])
def test_every_module_of_engine_and_gui_is_in_the_layout(folder):
    named = documented_paths()
    modules = sorted(str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / folder).rglob("*.py")
                     if path.name != "__init__.py" and "__pycache__" not in path.parts)
    missing = [module for module in modules if module not in named]
    assert not missing, f"modules missing from docs/architecture.md's layout: {missing}"


def test_the_readme_links_the_layout_page():
    assert REPO_ROOT / "docs" / "architecture.md" in linked_pages(README)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no heading with that anchor in {linked.name})")
    assert not broken, f"{page.relative_to(REPO_ROOT)}: broken links: {broken}"


def test_anchors_are_githubs():
    assert slug("Where the two-thread `s256` step goes, and `train_parallel` (2026-12-01, night)") == \
        "where-the-two-thread-s256-step-goes-and-train_parallel-2026-12-01-night"
    assert slug("A batch's products run on one OpenBLAS thread") == "a-batchs-products-run-on-one-openblas-thread"


def test_the_setup_commands_are_the_ones_ci_runs():
    commands = setup_commands()
    assert len(commands) == 2, f"the README's set-up should be two commands (install, test), got {commands}"
    install, test = commands
    assert "venv" in install and "pip install" in install, f"the install command makes no virtual environment: {install}"
    assert test == TEST_COMMAND
    ci_lines = [line.strip() for line in CI_SCRIPT.read_text(encoding="utf-8").splitlines()]
    for command in commands:
        assert command in ci_lines, f".ci/run does not run the README's command {command!r}"
    assert ci_lines.index(install) < ci_lines.index(test), ".ci/run must install before it tests"

