"""An answer is final only if the model saw what its code printed.

Some models (Claude 4.6 among them) do not stop after a code block: they write what they
expect it to print ("Output: ...") and an answer built on that guess, in the same reply.
The rule: **a literal answer is taken only from a reply that runs no other code before
it.** A literal is an answer the model typed: ``FINAL(7)`` in the text; in code,
``FINAL("7")``, ``print("FINAL(7)")``, ``answer["content"] = "7"``, or any answer equal
to a string (or an assigned number) written in the reply's code, such as
``x = "7"; FINAL(x)``. Code that only writes values down (imports, docstrings, names
bound to literals) does not count as code run. So ``FINAL(42)`` alone, or a block that
only binds and gives a literal, finishes at once; a literal after other code is
withheld: the blocks run, the model gets their real output and is told in one line to
give the answer again if it stands. An answer the code computed (``FINAL_VAR(n)``,
``FINAL(f"{n}")``, a value its logic picked without printing) stays final, unless a
block of the reply failed: the model did not see that.

What the model wrote once it began guessing a block's output (a line such as
"Output:", or a ```output / ```text fence, right after the block; not a heading that a
block of code follows) is left out: neither run nor read for an answer; the
conversation keeps the reply up to there, with a note, and a streamed turn is stopped
there (``LiveTurn``).

A literal is told from the reply's own code (``ast``), never from anything the sandbox
says: the code comes from the root model's reply, so its size is bounded by max_tokens.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .replies import normalise, read_reply
from .result import Withheld

if TYPE_CHECKING:
    from .replies import Fence, Reply
    from .result import Iteration

UNSEEN = "unseen output"  # an answer written after code whose output was not seen

# A line that labels what a block printed: "Output:", "**Output:**", "Result: 20".
_GUESS_LABEL = re.compile(
    r"[ \t]*(?:[>*_#]+[ \t]*)*(?:(?:expected|actual|execution|console|printed|sample)[ \t]+)?"
    r"(?:output|outputs|result|results|stdout)[ \t]*[*_]*[ \t]*(?::|$)",
    re.IGNORECASE,
)
_GUESS_FENCE = re.compile(
    r"[ \t]*`{3,}[ \t]*(?:output|text|txt|plaintext|console|stdout|result)[ \t]*$", re.IGNORECASE
)
_BLANK_LINES = re.compile(r"[ \t]*\n(?:[ \t]*\n)*")
_CODE_FENCE = re.compile(r"[ \t]*`{3,}[ \t]*(?:repl|python|py|python3|py3)[ \t]*(?:\n|$)", re.I)

LEFT_OUT_NOTE = (
    "[The rest of this reply was left out: it was written before the output of the code "
    "above was seen.]"
)


def guessed_output_at(text: str, fences: Sequence[Fence], streaming: bool = False) -> int | None:
    """Where the reply begins to guess a block's output: the first line after a closed
    runnable block (blank lines between) that labels output or opens an output fence. A
    label followed by a block of code ("Results:", then ```repl) is a heading, not a
    guess; ``streaming``: a label whose next line has not arrived is not one yet."""
    for fence in fences:
        if not (fence.runnable and fence.closed):
            continue
        gap = _BLANK_LINES.match(text, fence.end)
        if gap is None:  # prose on the closing fence's own line
            continue
        start = gap.end()
        end = text.find("\n", start)
        line = text[start : end if end != -1 else len(text)]
        if line and _GUESS_FENCE.match(line):
            return start
        if line and _GUESS_LABEL.match(line):
            following = _BLANK_LINES.match(text, end) if end != -1 else None
            if following is None or following.end() >= len(text):
                if streaming:
                    continue  # the next line decides
                return start
            if not _CODE_FENCE.match(text, following.end()):
                return start
    return None


def literal_finish(code: str, how: str, answer: str) -> bool:
    """Whether a block's answer (``how``: "code", "print" or "answer dict") is a literal
    written in the block rather than a value the block computed."""
    tree = _parsed(code)
    return tree is not None and answer in _literals(tree, how)


def ran_code(codes: Sequence[str]) -> bool:
    """Whether the reply's blocks ``codes`` did anything beyond writing values down:
    anything but imports, docstrings, assignments of literals and finishing."""
    for code in codes:
        tree = _parsed(code)
        if tree is None or not all(
            _writes_down(statement) or _finishes(statement) for statement in tree.body
        ):
            return True
    return False


def typed(codes: Sequence[str]) -> set[str]:
    """The values the model typed in the reply's code (so an answer equal to one was
    written by the model, not computed): its strings and placeholder-free f-strings,
    stripped, and the numbers it assigns or hands a finisher."""
    found: set[str] = set()
    for code in codes:
        tree = _parsed(code)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value.strip())
            elif isinstance(node, ast.JoinedStr):
                text = _text(node)
                if text != _UNKNOWN:
                    found.add(text.strip())
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                if node.value is not None:
                    found.update(_numbers(node.value))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id in ("FINAL", "FINAL_VAR"):
                    found.update(number for arg in node.args for number in _numbers(arg))
    found.discard("")
    return found


def _numbers(node: ast.AST) -> set[str]:
    return {
        str(item.value)
        for item in ast.walk(node)
        if isinstance(item, ast.Constant)
        and isinstance(item.value, (int, float))
        and not isinstance(item.value, bool)
    }


def _writes_down(statement: ast.stmt) -> bool:
    """An import, a docstring or ``pass``, or a name bound to a literal: nothing that
    shows output the model has not seen."""
    if isinstance(statement, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    if isinstance(statement, ast.Expr):
        return isinstance(statement.value, ast.Constant)
    if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
        return _text(statement.value) != _UNKNOWN or _is_container_of_literals(statement.value)
    return False


def _is_container_of_literals(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)  # a node of the model's own (bounded) code
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


@functools.lru_cache(maxsize=16)  # one finish reads its reply's blocks several ways
def _parsed(code: str) -> ast.Module | None:
    """The block's syntax tree (shared between readers: none of them changes it)."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _literals(tree: ast.Module, how: str) -> set[str]:
    """The answers the block's finishers are given as literals, for one way to finish."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if how == "answer dict" and isinstance(node, ast.Call) and _is_answer(node.func, "update"):
            found.update(_content(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name, args = node.func.id, node.args
            if how == "code" and len(args) == 1 and not node.keywords:
                # FINAL_VAR("name") names a variable: its value is computed.
                if name == "FINAL" or (name == "FINAL_VAR" and not _is_string(args[0])):
                    found.add(_text(args[0]))
            elif how == "print" and name == "print" and args:
                sep = next((k.value for k in node.keywords if k.arg == "sep"), None)
                texts = [_text(a) for a in args]
                joiner = " " if sep is None else _text(sep)
                if _UNKNOWN not in (*texts, joiner):
                    found.add(joiner.join(texts))
        elif how == "answer dict" and isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and _is_answer(target.value):
                    if _text(target.slice) == "content":
                        found.add(_text(node.value))
                elif isinstance(target, ast.Name) and target.id == "answer":
                    found.update(_content(node.value))
    found.discard(_UNKNOWN)
    return found


# What a node's text is when it is not a literal (no answer equals it: it holds a NUL).
_UNKNOWN = "\0not a literal"


def _text(node: ast.AST) -> str:
    """The text a literal node gives as an answer (str() of a non-string), or _UNKNOWN."""
    if isinstance(node, ast.JoinedStr):  # an f-string with no placeholders
        parts = [str(v.value) for v in node.values if isinstance(v, ast.Constant)]
        return "".join(parts) if len(parts) == len(node.values) else _UNKNOWN
    try:
        value = ast.literal_eval(node)  # a node of the model's own (bounded) code
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN
    if value is None:
        return _UNKNOWN
    return value if isinstance(value, str) else str(value)


def _is_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is_answer(node: ast.AST, method: str | None = None) -> bool:
    if method is not None:
        return isinstance(node, ast.Attribute) and node.attr == method and _is_answer(node.value)
    return isinstance(node, ast.Name) and node.id == "answer"


def _content(node: ast.AST) -> set[str]:
    """The literal 'content' of ``answer = {...}`` or ``answer.update(...)``."""
    if isinstance(node, ast.Call):
        found = {_text(k.value) for k in node.keywords if k.arg == "content"}
        return found.union(*(_content(arg) for arg in node.args))
    if isinstance(node, ast.Dict):
        return {
            _text(value)
            for key, value in zip(node.keys, node.values)
            if key is not None and _text(key) == "content"
        }
    return set()


def _finishes(statement: ast.stmt) -> bool:
    """A statement that gives the answer: a FINAL / FINAL_VAR call, a print of a
    FINAL(...) line, or setting the answer dict."""
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        func = statement.value.func
        if isinstance(func, ast.Name) and func.id in ("FINAL", "FINAL_VAR"):
            return True
        if isinstance(func, ast.Name) and func.id == "print" and statement.value.args:
            first = statement.value.args[0]
            if isinstance(first, ast.JoinedStr) and first.values:
                first = first.values[0]
            return _is_string(first) and str(getattr(first, "value", "")).lstrip().startswith(
                ("FINAL(", "FINAL_VAR(")
            )
        return _is_answer(func, "update")
    if isinstance(statement, (ast.Assign, ast.AugAssign)):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return all(_sets_answer(target) for target in targets)
    return False


def _sets_answer(target: ast.AST) -> bool:
    if isinstance(target, ast.Tuple):
        return all(_sets_answer(item) for item in target.elts)
    return _is_answer(target) or (isinstance(target, ast.Subscript) and _is_answer(target.value))


def as_seen(reply: str, reading: Reply, iteration: Iteration) -> str:
    """The reply as the conversation keeps it, ``reading`` being the part the run read
    (up to any guess of the output): without the guess and all that followed it, and,
    when an answer of the turn was withheld, without the text after its last block
    (it was written before the output was seen). What was left out goes to the
    trajectory; an answer in it is withheld too."""
    text = normalise(reply)
    kept = reading.text
    if len(kept) < len(text):
        guess = text[len(kept) :]
        iteration.withheld.append(Withheld(short(guess.strip().split("\n")[0]), "guessed output"))
        final = read_reply(guess).final
        if final is not None:
            iteration.withheld.append(Withheld(short(f"{final.kind}({final.value})"), UNSEEN))
    if any(item.why != "guessed output" for item in iteration.withheld):
        ends = [fence.end for fence in reading.fences if fence.runnable]
        kept = kept[: max(ends)] if ends else kept
    if kept.rstrip() == text.rstrip():
        return reply
    return f"{kept.rstrip()}\n\n{LEFT_OUT_NOTE}"


def told(iteration: Iteration) -> str | None:
    """The one line that tells the model an answer of its turn was not taken, if one
    was."""
    for item in iteration.withheld:
        if item.why == UNSEEN:
            return (
                f"[Your answer {item.what} was written before you saw the output above, so "
                "it was not taken; if it stands, give it again.]"
            )
        if item.why == "unseen failure":
            return (
                f"[Your answer {item.what} was not taken: a block of that reply failed "
                "(see above) before you saw it; if the answer stands, give it again.]"
            )
    return None


def short(text: str, limit: int = 120) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(text[: 4 * limit].split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
