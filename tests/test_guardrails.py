"""The guardrails CI runs before the tests (``scripts/check.sh``) catch what drifts: a
long module without a reason, a class holding too much, copied code past its ceiling,
and an import circle."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_layout", REPO / "scripts/check_layout.py")
assert _spec is not None and _spec.loader is not None
check_layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_layout)


def _module(lines: int, docstring: str = "A module.") -> str:
    body = "\n".join(f"x{i} = {i}" for i in range(lines - 3))
    return f'"""{docstring}\n"""\n\n{body}\n'


def _check(root: Path) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts/check_layout.py"), "--root", str(root)],
        capture_output=True,
        text=True,
    )
    return run.returncode, run.stdout


def test_the_package_as_it_is_passes():
    assert _check(REPO / "rlm_magic") == (0, "")


@pytest.mark.parametrize("lines", [401, 402, 1_000])
def test_a_module_over_400_lines_without_a_reason_fails(tmp_path, lines):
    (tmp_path / "long.py").write_text(_module(lines))
    status, said = _check(tmp_path)
    assert status == 1
    assert said.count("\n") == 1 and "long.py" in said and f"{lines} lines" in said


def test_a_module_of_400_lines_or_one_that_says_why_passes(tmp_path):
    (tmp_path / "fits.py").write_text(_module(400))
    (tmp_path / "says_why.py").write_text(
        _module(900, "A parser.\n\nWhy one module: one state machine, read top to bottom.")
    )
    assert _check(tmp_path) == (0, "")


def test_a_class_with_too_many_attributes_fails(tmp_path):
    many = "\n".join(
        f"        self.a{i} = {i}" for i in range(check_layout.MAX_CLASS_ATTRIBUTES + 1)
    )
    (tmp_path / "holder.py").write_text(f"class Holder:\n    def __init__(self):\n{many}\n")
    status, said = _check(tmp_path)
    assert status == 1
    assert f"class Holder has {check_layout.MAX_CLASS_ATTRIBUTES + 1} attributes" in said


def test_copied_code_past_the_ceiling_fails_and_is_listed(tmp_path):
    block = textwrap.dedent(
        """\
        def total_{k}(items):
            total_{k} = 0
            for item in items:
                if item.ready_{k}:
                    total_{k} += item.cost * item.count
            seen_{k} = sorted(set(items))
            return total_{k}, seen_{k}
        """
    )
    for k in range(check_layout.DUPLICATE_CEILING + 1):  # a pair of copies of each block
        for side in "ab":
            (tmp_path / f"{side}{k}.py").write_text(block.format(k=k))
    first_two = [tmp_path / "a0.py", tmp_path / "b0.py"]
    pairs = check_layout.duplicate_pairs({path: path.read_text() for path in first_two})
    assert [(a.name, first, last, b.name) for a, first, last, b, _, _ in pairs] == [
        ("a0.py", 1, 7, "b0.py")
    ]
    status, said = _check(tmp_path)
    assert status == 1
    assert f"{check_layout.DUPLICATE_CEILING + 1} pairs" in said and "the ceiling is" in said


def test_docstrings_comments_and_brackets_are_not_copied_code(tmp_path):
    prose = '"""' + "\n".join(f"Line {i} of the same words." for i in range(10)) + '\n"""\n'
    files = {tmp_path / f"{name}.py": prose + "x = 1\n" for name in "ab"}
    assert check_layout.duplicate_pairs(files) == []


@pytest.mark.skipif(
    shutil.which("lint-imports") is None
    and not (Path(sys.executable).parent / "lint-imports").exists(),
    reason="import-linter (the lint extra) is not installed",
)
def test_a_new_import_circle_fails(tmp_path):
    shutil.copytree(REPO / "rlm_magic", tmp_path / "rlm_magic")
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    (tmp_path / "rlm_magic/llm/circle_a.py").write_text("from . import circle_b  # noqa\n")
    (tmp_path / "rlm_magic/llm/circle_b.py").write_text("from . import circle_a  # noqa\n")
    lint_imports = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    run = subprocess.run(
        [lint_imports, "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": str(Path(sys.executable).parent)},
    )
    assert run.returncode == 1, run.stdout
    assert "circle_a" in run.stdout and "BROKEN" in run.stdout


def test_a_signature_a_protocol_repeats_is_not_copied_code(tmp_path):
    signature = (
        "class {name}:\n"
        "    async def stream(\n"
        "        self,\n"
        "        request: Request,\n"
        "        state: StreamState,\n"
        "        *,\n"
        "        stall_timeout: float,\n"
        "        deadline: float | None,\n"
        "        messages: Messages | None = None,\n"
        "    ) -> Answer:\n"
        "        return await self.{name}_stream(request)\n"
    )
    files = {tmp_path / f"{name}.py": signature.format(name=name) for name in ("wire", "sdk")}
    assert check_layout.duplicate_pairs(files) == []
