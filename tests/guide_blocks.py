"""The fenced blocks of the README and the guide (docs/), and what each says the tests do with it.

A block's check is named in an HTML comment on the line just before its fence (invisible on GitHub and on the site):

- ``<!-- guide: run -->``: python runs in the page's namespace (the page's blocks in order, a line followed by
  ``# value`` comment lines must evaluate to that value); bash runs as a script in the page's folder (``set -e``).
  Both run against the page's fixture, named once at the top of the page: ``<!-- guide: page server=demo -->``
  (``workbench demo`` served by ``workbench serve``, TF Serving's ports 8500/8501 swapped for free ones), and
  ``setup=NAME`` (files and Python names made by the test, tests/system/test_guide_pages.py's ``SETUPS``), and
  ``after=NAME`` (a check of what the blocks made, its ``AFTER``: the manifests a page generates are validated).
- ``<!-- guide: same-as README -->``: the block is one of the README's, word for word; tests/system/test_readme.py
  runs that one (the tour in a real kernel, the headless blocks against ``workbench serve``).
- ``<!-- guide: parse -->``: for what cannot run here (a cluster, Docker, a cloud bucket, an install). Every line is
  checked for real, or the check fails: ``workbench ...`` by the command line's own parser, ``%serve ...`` by the
  magic's, ``pip install`` lines by the extras pyproject.toml declares, ``make X`` by the Makefile's targets,
  ``kubectl`` / ``docker`` by the repository files they name (YAML parsed, the Dockerfile by BuildKit's parser, a
  ``docker run``'s flags by ``workbench serve``'s parser), ``curl`` by its JSON body; python by compiling it and
  resolving every ``workbench.…`` name it uses.

``text`` blocks (diagrams, outputs, file trees) are shown, not run; ``json`` blocks must parse. Any other block
without a check fails the tests, so that nothing is skipped silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# design.md's diagrams are its own (another page's rules, no code); every other page is read.
NOT_READ = {"design.md"}
SHOWN = {"text", "json"}
CHECKS = {"run", "same-as", "parse"}

_FENCE = re.compile(r"(?P<indent> *)```(?P<language>[\w-]*)\s*")
_MARK = re.compile(r"\s*<!-- guide: (?P<words>[^>]*?) -->\s*")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    check: str  # "run", "same-as", "parse", or "" for shown blocks
    argument: str  # what follows the check's name ("README" for same-as)
    section: str  # the last "## " heading above it

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [README, *sorted(p for p in DOCS.rglob("*.md") if p.name not in NOT_READ)]


def page_settings(path: Path) -> dict[str, str]:
    """``<!-- guide: page server=demo setup=NAME -->``: the page's fixture (empty when it names none)."""
    for line in path.read_text().splitlines():
        mark = _MARK.fullmatch(line)
        if mark and mark.group("words").split()[0] == "page":
            return dict(word.split("=", 1) for word in mark.group("words").split()[1:])
    return {}


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    page = str(path.relative_to(ROOT))
    found: list[Block] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        fence = _FENCE.fullmatch(line)
        if fence:
            indent = fence.group("indent")
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            code = "\n".join(text[len(indent) :] for text in lines[i + 1 : end])
            mark = _MARK.fullmatch(lines[i - 1]) if i else None
            words = mark.group("words").split(maxsplit=1) if mark else [""]
            found.append(Block(page, i + 1, fence.group("language"), code, words[0], (words[1:] or [""])[0], section))
            i = end
        i += 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in pages() for block in blocks(path)]


def unchecked(block: Block) -> str | None:
    """Why a block breaks the convention, or None."""
    if block.language in SHOWN:
        return None if not block.check else f"{block.where}: a {block.language} block is shown, not checked"
    if block.language not in {"python", "bash"}:
        return f"{block.where}: a block must say its language: python, bash, or text/json for what is shown"
    if block.check not in CHECKS:
        return f"{block.where}: no <!-- guide: run|same-as README|parse --> before this {block.language} block"
    return None


def commands(code: str) -> list[str]:
    """A bash block's command lines: continuations joined, comments and comment lines left out."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        text = line.strip()
        if text and not text.startswith("#"):
            out.append(_without_comment(text))
    return out


def _without_comment(line: str) -> str:
    """The line without a trailing ``# comment`` (a ``#`` outside quotes, after a space)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


# ------------------------------------------- "# value" expectations (the README's tour and headless blocks too)
EXPECT_HELPER = '''
def _readme_expect(value, expected):
    """The README shows ``expected`` (a repr, maybe wrapped over lines) under a line: it must be the value."""
    import re
    normal = lambda text: " ".join(str(text).split())
    # "..." in a promise stands for what the page leaves out (the rest of a long repr).
    pattern = ".*".join(map(re.escape, normal(expected).split("...")))
    assert re.fullmatch(pattern, normal(repr(value))), f"README promises {expected!r}, got {value!r}"
'''


def with_expectations(code: str) -> str:
    """Each line followed by ``# value`` comment lines checks that it evaluates to that value."""
    lines = code.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        expected: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].startswith("# "):
            expected.append(lines[j][2:])
            j += 1
        if expected and line.strip() and not line.startswith(("#", " ")):
            out.append(f"_readme_value = {line}")
            out.append(f"_readme_expect(_readme_value, {' '.join(expected)!r})")
            i = j
        else:
            out.append(line)
            i += 1
    return "\n".join(out)
