"""The layout rules no linter checks, run by ``scripts/check.sh`` (CI runs it first).

- **A module over 400 lines says why it is one concept**: its docstring has a paragraph
  that starts ``Why one module:``. A long module is sometimes right (one state machine,
  one policy table); the reason written down is what keeps it from growing by default.
- **A class holds at most 27 attributes** (what ``self.x = ...`` and class-level
  annotations name): past that, it is several things sharing an object.
- **Copied code has a ceiling**: the package may hold at most ``DUPLICATE_CEILING`` pairs
  of places sharing ``DUPLICATE_LINES`` or more identical lines (compared without their
  indentation, blank lines, comments, docstrings and signatures). Lower the ceiling when a clean-up
  removes pairs; raise it only with a reason in the commit. ``--duplicates`` lists them.

Exit status 1 with one line per offence; stdlib only.

    python scripts/check_layout.py                 check rlm_magic/
    python scripts/check_layout.py --duplicates    list the copied places
    python scripts/check_layout.py --root DIR      check another package folder
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import re
import sys
import tokenize
from collections import defaultdict
from pathlib import Path

MAX_MODULE_LINES = 400
WHY_MARKER = "Why one module:"
MAX_CLASS_ATTRIBUTES = 27
DUPLICATE_LINES = 6
DUPLICATE_CEILING = 4
# A window of lines standing in more places than this is an idiom, not a copy.
TOO_COMMON = 8

# A line made only of these says nothing on its own (closing brackets, `else:`...).
_THIN = frozenset("()[]{},:; ")
_THIN_WORDS = frozenset({"else:", "try:", "finally:", "pass", "return", "continue", "break"})
# A function's signature, a parameter a line: a Protocol's implementations repeat it, and
# they must (the lines copied are the contract, not logic).
_SIGNATURE = re.compile(
    r"(?:async )?def \w+\(|\*|self,|\*?\*?\w+(?:: [^=]+)?(?: = .+)?,|\) -> .+:|\):"
)


def _docstring(tree: ast.Module) -> str:
    return ast.get_docstring(tree) or ""


def module_size_offences(path: Path, text: str, tree: ast.Module) -> list[str]:
    lines = text.count("\n") + (not text.endswith("\n") and bool(text))
    if lines > MAX_MODULE_LINES and WHY_MARKER not in _docstring(tree):
        return [
            f"{path}: {lines} lines (over {MAX_MODULE_LINES}) and its docstring does not say "
            f"why it is one concept (a paragraph starting {WHY_MARKER!r})"
        ]
    return []


def class_attribute_offences(path: Path, tree: ast.Module) -> list[str]:
    offences = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        names = {
            item.target.id
            for item in node.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
        }
        for inner in ast.walk(node):
            if (
                isinstance(inner, ast.Attribute)
                and isinstance(inner.ctx, ast.Store)
                and isinstance(inner.value, ast.Name)
                and inner.value.id == "self"
            ):
                names.add(inner.attr)
        if len(names) > MAX_CLASS_ATTRIBUTES:
            offences.append(
                f"{path}:{node.lineno}: class {node.name} has {len(names)} attributes "
                f"(at most {MAX_CLASS_ATTRIBUTES}): split what it holds"
            )
    return offences


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, stripped text) of the lines that are code: no blank lines, comments,
    docstrings or lines of brackets alone."""
    in_string: set[int] = set()
    previous = None
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        # A string that is a statement of its own (a docstring) is prose, not code.
        if token.type == tokenize.STRING and previous in (
            None,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.NL,
        ):
            in_string.update(range(token.start[0], token.end[0] + 1))
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            previous = token.type
    kept = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if (
            number in in_string
            or not stripped
            or stripped.startswith("#")
            or set(stripped) <= _THIN
            or stripped in _THIN_WORDS
            or _SIGNATURE.fullmatch(stripped)
        ):
            continue
        kept.append((number, stripped))
    return kept


def duplicate_pairs(files: dict[Path, str]) -> list[tuple[Path, int, int, Path, int, int]]:
    """Pairs of places sharing ``DUPLICATE_LINES`` or more identical code lines, each run
    once: (file, first line, last line) for both sides."""
    lines = {path: _code_lines(text) for path, text in files.items()}
    places: dict[bytes, list[tuple[Path, int]]] = defaultdict(list)
    for path, kept in lines.items():
        for start in range(len(kept) - DUPLICATE_LINES + 1):
            window = "\n".join(text for _, text in kept[start : start + DUPLICATE_LINES])
            places[hashlib.blake2b(window.encode(), digest_size=16).digest()].append((path, start))
    matched: set[tuple[Path, int, Path, int]] = set()
    for where in places.values():
        if len(where) < 2 or len(where) > TOO_COMMON:
            continue
        for i, (a, at) in enumerate(where):
            for b, bt in where[i + 1 :]:
                if a == b and abs(at - bt) < DUPLICATE_LINES:
                    continue  # a window overlapping itself (repeated lines in a row)
                matched.add((a, at, b, bt))
    pairs = []
    for a, at, b, bt in sorted(matched, key=lambda m: (str(m[0]), m[1], str(m[2]), m[3])):
        if (a, at - 1, b, bt - 1) in matched:
            continue  # inside a run already counted from its start
        length = DUPLICATE_LINES
        while (a, at + length - DUPLICATE_LINES + 1, b, bt + length - DUPLICATE_LINES + 1) in (
            matched
        ):
            length += 1
        pairs.append(
            (
                a,
                lines[a][at][0],
                lines[a][at + length - 1][0],
                b,
                lines[b][bt][0],
                lines[b][bt + length - 1][0],
            )
        )
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="rlm_magic", help="the package folder to check")
    parser.add_argument("--duplicates", action="store_true", help="list the copied places")
    options = parser.parse_args(argv)
    root = Path(options.root)
    files = {path: path.read_text(encoding="utf-8") for path in sorted(root.rglob("*.py"))}
    offences: list[str] = []
    for path, text in files.items():
        tree = ast.parse(text, filename=str(path))
        offences += module_size_offences(path, text, tree)
        offences += class_attribute_offences(path, tree)
    pairs = duplicate_pairs(files)
    if options.duplicates:
        for a, a1, a2, b, b1, b2 in pairs:
            print(f"{a}:{a1}-{a2} ~ {b}:{b1}-{b2}")
    if len(pairs) > DUPLICATE_CEILING:
        offences.append(
            f"{root}: {len(pairs)} pairs of places share {DUPLICATE_LINES}+ identical lines "
            f"(the ceiling is {DUPLICATE_CEILING}): make one place serve both "
            "(python scripts/check_layout.py --duplicates lists them)"
        )
    for offence in offences:
        print(offence)
    return 1 if offences else 0


if __name__ == "__main__":
    sys.exit(main())
