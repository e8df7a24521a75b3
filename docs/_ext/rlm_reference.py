"""The reference pages, generated from the code so they cannot drift from it.

Each page is Markdown (MyST) built from what the code itself holds:
- ``settings``: every ``RLM`` setting (a configurable trait), with its type, default and
  help, in the order and sections of the class's source;
- ``magics``: the ``%%rlm`` and ``%%llm`` options from their ``magic_arguments``, and the
  ``%rlm`` subcommands from the dispatcher's table and its help text;
- ``api``: the names ``rlm_magic.__all__`` exports, documented by autodoc from docstrings,
  and the notebook helpers (``llm_query``, ``llm_query_batch``, ``rlm_query``,
  ``rlm_query_batch``) with their signatures and docstrings;
- ``errors``: the exception classes of ``rlm_magic.errors``, as a tree.

As a Sphinx extension, it writes the pages into ``docs/reference/generated/`` when the
build starts (a page is rewritten only when its text changed, so rebuilds stay
incremental); ``tests/test_docs.py`` calls the same functions without Sphinx. It also
copies the example notebooks, with their stored outputs, into ``docs/tutorial/notebooks/``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent
GENERATED = DOCS / "reference" / "generated"
NOTEBOOKS = DOCS.parent / "notebooks"
TUTORIAL_NOTEBOOKS = DOCS / "tutorial" / "notebooks"

_CODE_SPAN = re.compile(r"(`[^`\n]+`)")
_PUNCTUATION = re.compile(r"([\\`*_\[\]<>{}|$#~!&])")


def plain(text: str) -> str:
    """``text`` (a help string) as Markdown that reads exactly as written: its single
    backtick code spans stay code, every other Markdown character is escaped."""
    parts = _CODE_SPAN.split(re.sub(r"\s+", " ", text))
    return "".join(
        part if index % 2 else _PUNCTUATION.sub(r"\\\1", part) for index, part in enumerate(parts)
    )


# -- settings ----------------------------------------------------------------------------


def settings() -> list[tuple[str, list[tuple[str, Any]]]]:
    """The configurable traits of ``RLM``, as (section, [(name, trait)]) in source order;
    a trait the source scan does not place goes under "Other settings"."""
    from rlm_magic import RLM

    traits = RLM.class_traits(config=True)
    sections: list[tuple[str, list[tuple[str, Any]]]] = []
    placed: set[str] = set()
    for cls in reversed(RLM.__mro__):
        if cls is object or not any(name in vars(cls) for name in traits):
            continue
        section = "Settings"
        for line in inspect.getsource(cls).splitlines():
            heading = re.match(r"\s*# -- (.+?) -+\s*$", line)
            if heading:
                section = re.sub(r"\s*\(issue \d+\)", "", heading.group(1))
                section = section[0].upper() + section[1:]
                continue
            assigned = re.match(r"\s{4}(\w+)\s*(?::[^=]+)?=", line)
            if assigned and assigned.group(1) in traits and assigned.group(1) not in placed:
                name = assigned.group(1)
                placed.add(name)
                if not sections or sections[-1][0] != section:
                    sections.append((section, []))
                sections[-1][1].append((name, traits[name]))
    rest = sorted(set(traits) - placed)
    if rest:
        sections.append(("Other settings", [(name, traits[name]) for name in rest]))
    return sections


def _default(cls: type, name: str, trait: Any) -> str:
    generator = cls._all_trait_default_generators.get(name)  # type: ignore[attr-defined]
    if generator is not None and not inspect.ismethod(generator):
        return "computed when first read (see below)"
    return f"`{trait.default_value_repr()}`"


def settings_markdown() -> str:
    from rlm_magic import RLM

    lines = [
        "# Settings",
        "",
        "Every setting of the one configurable, `RLM`, with its help as `%config RLM` shows",
        "it. Set one with `%config RLM.max_concurrency = 32` in a notebook,",
        "`c.RLM.max_concurrency = 32` in `ipython_config.py`, or `RLM(max_concurrency=32)`;",
        "`%rlm config` shows the effective values, secrets masked.",
        "",
        "```{note}",
        "This page is generated from `rlm_magic.config` when the documentation is built.",
        "```",
        "",
    ]
    for section, members in settings():
        lines += [f"## {section}", ""]
        for name, trait in members:
            kind = type(trait).__name__ + (" or None" if trait.allow_none else "")
            lines += [
                f"```{{confval}} RLM.{name}",
                f":type: `{kind}`",
                f":default: {_default(RLM, name, trait)}",
                "",
                plain(trait.help or "(no help)"),
                "```",
                "",
            ]
    return "\n".join(lines)


# -- magics ------------------------------------------------------------------------------


def cell_magic_parsers() -> dict[str, argparse.ArgumentParser]:
    from rlm_magic.jupyter.magics import RLMMagics

    return {"%%rlm": RLMMagics.rlm_cell.parser, "%%llm": RLMMagics.llm_cell.parser}


def options(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str]]:
    """(the option as written, its help with argparse's %-expansion) for each option."""
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        spelled = ", ".join(
            option + (f" {action.metavar or action.dest.upper()}" if action.nargs != 0 else "")
            for option in action.option_strings
        )
        yield spelled, formatter._expand_help(action) if action.help else ""


def help_entries(text: str) -> list[tuple[str, str]]:
    """``%rlm help``'s text as (usage, what it does) pairs. The descriptions start at one
    column (the one most lines use); an entry's indented lines continue its usage when they
    start left of that column, its description when they start at it."""
    lines = text.splitlines()
    starts = [m.end() - 1 for line in lines if (m := re.search(r"\S\s{2,}(?=\S)", line))]
    column = max(set(starts), key=starts.count) + 1 if starts else 0
    entries: list[tuple[list[str], list[str]]] = []
    for line in lines:
        if line.startswith("%"):
            head, tail = line, ""
            if column and len(line) > column and line[column - 1] == " ":
                head, tail = line[:column], line[column:]
            entries.append(([head.strip()], [tail.strip()] if tail.strip() else []))
        elif entries and line[:1].isspace():
            indent = len(line) - len(line.lstrip())
            entries[-1][1 if indent >= column else 0].append(line.strip())
    return [(" ".join(usage), " ".join(what)) for usage, what in entries]


def subcommands() -> list[tuple[str, list[tuple[str, str]]]]:
    """Each ``%rlm`` subcommand with the entries of ``%rlm help`` that describe it."""
    from rlm_magic.jupyter import subcommands as module

    entries = help_entries(module.HELP)
    return [
        (command, [e for e in entries if re.match(rf"%rlm {re.escape(command)}\b", e[0])])
        for command in module._COMMANDS
    ]


def magics_markdown() -> str:
    from rlm_magic.jupyter import subcommands as module

    lines = [
        "# Magics",
        "",
        "```{note}",
        "This page is generated from the magics' `magic_arguments` and the `%rlm`",
        "dispatcher when the documentation is built; `%%rlm?` and `%rlm help` show the same.",
        "```",
        "",
    ]
    for magic, parser in cell_magic_parsers().items():
        # IPython writes the usage and the magic's docstring as reStructuredText.
        usage = parser.format_usage().strip("\n")
        description = inspect.cleandoc(parser.description or "")
        lines += [f"## `{magic}`", "", "```{eval-rst}", usage, "", description, "```", ""]
        lines += ["| option | meaning |", "|---|---|"]
        for spelled, help_text in options(parser):
            lines.append(f"| `{spelled}` | {plain(help_text)} |")
        lines.append("")
    lines += [
        "## `%rlm` subcommands",
        "",
        "| subcommand | what it does |",
        "|---|---|",
    ]
    for command, entries in subcommands():
        if not entries:
            lines.append(f"| `%rlm {command}` | (not described in `%rlm help`) |")
        for usage, what in entries:
            lines.append(f"| `{usage}` | {plain(what)} |")
    lines += ["", "`%rlm help` prints:", "", "```text", module.HELP.rstrip(), "```", ""]
    return "\n".join(lines)


# -- API and errors ----------------------------------------------------------------------


def api_markdown() -> str:
    import rlm_magic

    lines = [
        "# Python API",
        "",
        "```{note}",
        "This page is generated from `rlm_magic.__all__` and the docstrings when the",
        "documentation is built. The settings of `RLM` are on [](settings.md).",
        "```",
        "",
        "```{eval-rst}",
        ".. module:: rlm_magic",
        "```",
        "",
    ]
    setting_names = {name for _, members in settings() for name, _ in members}
    for name in rlm_magic.__all__:
        obj = getattr(rlm_magic, name)
        if name == "__version__":
            lines += ["```{eval-rst}", ".. data:: __version__", "", f"   ``{obj!r}``", "```", ""]
        elif inspect.isclass(obj):
            directive = "autoexception" if issubclass(obj, BaseException) else "autoclass"
            lines += ["```{eval-rst}", f".. {directive}:: {name}", "   :members:"]
            if name == "RLM":
                # Its base, RLMConfig, holds the settings (on their own page): no API.
                lines.append(f"   :exclude-members: {', '.join(sorted(setting_names))}")
            elif obj.__bases__ != (object,):
                lines.append("   :show-inheritance:")
            lines += ["```", ""]
        else:
            lines += ["```{eval-rst}", f".. autofunction:: {name}", "```", ""]
    return "\n".join(lines + notebook_helpers_markdown())


def notebook_helpers() -> list[tuple[str, Any]]:
    """The helpers ``%load_ext rlm_magic`` puts in the notebook (the REPL's table less its
    aliases, the official library's spellings), as (name, method)."""
    from rlm_magic.jupyter.helpers import NotebookHelpers
    from rlm_magic.repl.helpers import HELPERS

    return [(h.name, getattr(NotebookHelpers, h.name)) for h in HELPERS if h.alias_of is None]


def notebook_helpers_markdown() -> list[str]:
    """A section on the notebook helpers: each one's signature (names and defaults) and
    its docstring, which says what it returns and raises."""
    import rlm_magic

    lines = [
        "## Notebook helpers",
        "",
        "`%load_ext rlm_magic` (or the *Python 3 (RLM)* kernel) puts these in the notebook, "
        "bound to the session's `RLM` (its `%config RLM...` settings); each is awaited "
        "(`answer = await llm_query(...)`). The model's code in a `%%rlm` run has the same "
        "names, and `llm_query_batched` and `rlm_query_batched`, the official RLM library's "
        "spellings. `amap` is above.",
        "",
        "`rlm_query` raises `RLMRunError` when the child run ends without an answer (its "
        "`.result` holds the partial run); `rlm_query_batch` raises `BatchError` when an "
        "item fails, as `llm_query_batch` does, unless `return_exceptions=True`.",
        "",
        "```{eval-rst}",
        ".. currentmodule:: None",
        "",
    ]
    for name, method in notebook_helpers():
        if name in rlm_magic.__all__:
            continue  # documented above
        signature = inspect.signature(method)
        parameters = list(signature.parameters.values())[1:]  # less self
        shown = signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in parameters],
            return_annotation=signature.empty,
        )
        lines += [f".. py:function:: {name}{shown}", "   :async:", ""]
        doc = inspect.getdoc(method) or ""
        lines += [f"   {line}".rstrip() for line in doc.splitlines()] + [""]
    return [*lines, "```", ""]


def error_classes() -> list[type]:
    module = importlib.import_module("rlm_magic.errors")
    return [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and issubclass(cls, BaseException)
    ]


def errors_markdown() -> str:
    import rlm_magic

    classes = error_classes()
    exported = set(rlm_magic.__all__)

    def parents(cls: type) -> list[type]:
        return [base for base in cls.__bases__ if base in classes]

    def tree(cls: type, depth: int) -> list[str]:
        bases = [b.__name__ for b in cls.__bases__]
        doc = inspect.getdoc(cls) or ""
        first = " ".join(doc.split("\n\n")[0].split())
        name = f"`rlm_magic.{cls.__name__}`" if cls.__name__ in exported else f"`{cls.__name__}`"
        out = [f"{'  ' * depth}- {name} ({', '.join(bases)}): {_rst_literals(first)}"]
        for child in classes:
            if parents(child)[:1] == [cls]:
                out += tree(child, depth + 1)
        return out

    lines = [
        "# Errors",
        "",
        "Every exception class in `rlm_magic.errors`, under the class it derives from first",
        "(its other bases are named in brackets). The ones exported from `rlm_magic` are",
        "written with the package's name and documented on [](api.md). An error rlm-magic",
        "raises in a notebook reads as one line with what to change.",
        "",
        "```{note}",
        "This page is generated from `rlm_magic.errors` when the documentation is built.",
        "```",
        "",
    ]
    for cls in classes:
        if not parents(cls):
            lines += tree(cls, 0)
    lines.append("")
    return "\n".join(lines)


def _rst_literals(text: str) -> str:
    """A docstring's first paragraph, its ``literal`` spans as Markdown code spans."""
    parts = re.split(r"``(.+?)``", text)
    return "".join(f"`{part}`" if index % 2 else plain(part) for index, part in enumerate(parts))


PAGES = {
    "settings.md": settings_markdown,
    "magics.md": magics_markdown,
    "api.md": api_markdown,
    "errors.md": errors_markdown,
}


def write_pages(folder: Path = GENERATED) -> list[Path]:
    """Write the reference pages; a page whose text is unchanged is left alone."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in PAGES.items():
        path = folder / name
        text = make()
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def copy_notebooks(folder: Path = TUTORIAL_NOTEBOOKS) -> None:
    """The example notebooks, as stored (outputs included), for the tutorial."""
    folder.mkdir(parents=True, exist_ok=True)
    for source in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        target = folder / source.name
        if not target.exists() or target.read_bytes() != source.read_bytes():
            shutil.copyfile(source, target)


def _on_builder_inited(app: Any) -> None:
    write_pages()
    copy_notebooks()


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _on_builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
