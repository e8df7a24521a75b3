"""The test suite's shape: no test module imports another test module, and nothing imports
from ``conftest`` (it holds fixtures, which pytest hands to tests by name). What tests
share lives in ``tests/support/``.

    python scripts/check_tests.py [TESTS_DIR]

Prints one line per offence (``tests/test_a.py:12: imports tests.test_b``) and exits 1 if
there is any; exits 0 in silence otherwise. Standard library only: ``scripts/check.sh``
runs it before anything is installed.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path, root: Path) -> str:
    """The dotted name ``path`` is imported under, from the folder holding ``tests``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> list[str]:
    """Every module name ``node`` may bind: the module itself and, for ``from X import
    a``, ``X.a`` (which is a module when ``a`` is one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = importer.split(".")
        if not is_package:
            package.pop()
        if node.level > 1:
            package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def forbidden(name: str, root: Path) -> str | None:
    """Why importing ``name`` breaks the rule, or None: it is a test module or a
    ``conftest`` of the folder being checked (a file of that name exists there)."""
    path = root.joinpath(*name.split(".")).with_suffix(".py")
    if not name or not path.is_file():
        return None
    if path.stem == "conftest":
        return f"imports from {name} (conftest holds fixtures only: use tests/support)"
    if path.stem.startswith("test_"):
        return f"imports the test module {name} (move what is shared into tests/support)"
    return None


def offences(tests_dir: Path) -> Iterator[str]:
    root = tests_dir.parent
    for path in sorted(tests_dir.rglob("*.py")):
        importer = module_name(path, root)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except SyntaxError as error:
            yield f"{path.relative_to(root)}:{error.lineno}: does not parse: {error.msg}"
            continue
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            reasons = {forbidden(name, root) for name in imported(node, importer, is_package)}
            for reason in sorted(reason for reason in reasons if reason):
                yield f"{path.relative_to(root)}:{node.lineno}: {reason}"


def main(argv: list[str]) -> int:
    tests_dir = Path(argv[0]).resolve() if argv else ROOT / "tests"
    if not tests_dir.is_dir():
        print(f"check_tests: no such folder: {tests_dir}", file=sys.stderr)
        return 2
    found = list(offences(tests_dir))
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
