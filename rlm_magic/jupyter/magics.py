"""``%%rlm`` (run an RLM over a notebook variable), ``%%llm`` (one question) and ``%rlm``
(its subcommands: ``subcommands``).

IPython has no async magics, so a ``%%rlm`` cell is rewritten by an input transformer
into a top-level ``await``: ipykernel then runs the cell as a coroutine on its own loop,
sub-calls run concurrently and the loop stays responsive. (A plain magic would have to
block the loop, or nest a second one, and litellm's clients are tied to one loop.)

Why one module: the magics' option tables and the checks that read them (which options
go together, what each becomes for ``RLM.arun``) change together.
"""

from __future__ import annotations

import argparse
import asyncio
import keyword
import string
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from IPython.core import magic
from IPython.core import magic_arguments as arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, magics_class
from IPython.core.magic_arguments import parse_argstring

from ..errors import ConfigError, interrupt
from . import subcommands
from .interrupts import run_interruptibly

if TYPE_CHECKING:
    from ..rlm.run import Run
    from ..rlm.runner import RLM

_Function = TypeVar("_Function", bound=Callable[..., Any])


def _typed(decorator: Any) -> Callable[..., Callable[[_Function], _Function]]:
    """One of IPython's magic decorators (untyped) as what it is: it registers the
    function, and returns it."""
    return cast(Callable[..., Callable[[_Function], _Function]], decorator)


argument = _typed(arguments.argument)
magic_arguments = _typed(arguments.magic_arguments)
cell_magic = _typed(magic.cell_magic)
line_magic = _typed(magic.line_magic)


@magics_class
class RLMMagics(Magics):  # type: ignore[misc, unused-ignore]  # IPython's: untyped
    """The magics of rlm-magic, bound to the session's ``RLM``."""

    def __init__(self, shell: Any, rlm: RLM):
        super().__init__(shell)
        self.rlm = rlm

    @magic_arguments("%rlm")  # the usage line reads %%rlm (IPython adds one %)
    @argument(
        "-c",
        "--context",
        metavar="NAME",
        help="Notebook variable the model sees as `context` (str, list, dict, DataFrame, ...).",
    )
    @argument(
        "-o",
        "--out",
        metavar="NAME",
        default="_rlm",
        help="Variable that receives the RLMResult (default: _rlm).",
    )
    @argument("--model", help="Root model for this run (default: RLM.model).")
    @argument("--sub-model", help="Sub-call model for this run (default: RLM.sub_model).")
    @argument("--max-iterations", type=int, metavar="N", help="Most root-model turns.")
    @argument("--max-depth", type=int, metavar="N", help="Most rlm_query nesting.")
    @argument(
        "--live",
        action="store_true",
        help="Run the model's code in the notebook's own namespace. It can then "
        "read and change your variables: use only with code you would run.",
    )
    @argument(
        "--sandbox",
        dest="sandbox",
        action="store_const",
        const="auto",
        help="Run the model's code in the strongest sandbox that works here "
        "(default: RLM.sandbox).",
    )
    @argument(
        "--wasm",
        dest="sandbox",
        action="store_const",
        const="wasm",
        help="Run the model's code in the WebAssembly sandbox (Deno + Pyodide; any OS).",
    )
    @argument(
        "--no-sandbox",
        dest="sandbox",
        action="store_const",
        const="none",
        help="Run the model's code in threads of this kernel.",
    )
    @argument(
        "--session",
        metavar="NAME",
        help="Carry on in session NAME: the REPL variables, contexts (context_0, "
        "context_1, ...) and answers of its earlier questions are kept for "
        "this one. `%%rlm sessions` lists them, `%%rlm forget NAME` ends one.",
    )
    @argument("-q", "--quiet", action="store_true", help="Do not display the result.")
    @argument(
        "--no-raise",
        action="store_true",
        help="A run that fails does not fail the cell: its one-line error is "
        "printed instead (for notebooks run by papermill or a scheduler, "
        "which stop at the first failing cell).",
    )
    @argument(
        "--no-interpolate",
        action="store_true",
        help="Send the query as written: no {variable} substitution.",
    )
    @cell_magic("rlm")
    def rlm_cell(self, line: str, cell: str) -> object:
        """Answer the question in the cell body with a Recursive Language Model.

        The cell body is the query; ``{name}`` inserts a notebook variable (``{{`` is a
        literal brace). The answer is shown as Markdown and the full ``RLMResult``
        (answer, trajectory, usage) is stored in the ``--out`` variable.

        Example::

            %%rlm --context logs --out res
            Which services had the most timeouts last week, and why?
        """
        # Reached only when the input transformer did not run (e.g. a direct
        # run_cell_magic call); inside a running loop we cannot wait for the run.
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(run_rlm_cell(line, cell, self.shell))
        raise UsageError(
            "%%rlm must be the first line of a cell (it runs as a top-level "
            "await); from code, use `await rlm_magic.RLM().arun(...)`"
        )

    @magic_arguments("%llm")
    @argument("-m", "--model", help="Model to ask (default: RLM.model).")
    @argument("-s", "--system", metavar="TEXT", help="A system prompt for the question.")
    @argument(
        "-o",
        "--out",
        metavar="NAME",
        default="_llm",
        help="Variable that receives the answer's text (default: _llm).",
    )
    @argument("-q", "--quiet", action="store_true", help="Do not show the answer.")
    @argument(
        "--no-interpolate",
        action="store_true",
        help="Send the question as written: no {variable} substitution.",
    )
    @cell_magic("llm")
    def llm_cell(self, line: str, cell: str) -> object:
        """Ask a model the question in the cell body, in one call; the answer streams in
        and is shown as Markdown (no REPL, no sub-calls: for that, use %%rlm).

        ``{name}`` inserts a notebook variable (``{{`` is a literal brace). The call
        counts in ``%rlm usage`` and can be interrupted like any other.

        Example::

            %%llm -m openai/gpt-4o-mini
            Explain {error_message} in two sentences.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(run_llm_cell(line, cell, self.shell))
        raise UsageError("%%llm must be the first line of a cell (it runs as a top-level await)")

    @line_magic("rlm")
    def rlm_line(self, line: str) -> object:
        # (Its docstring, what %rlm? shows, is the subcommands' help: set below.)
        return subcommands.dispatch(self, line)

    # %rlm? lists every subcommand, from the one text %rlm help prints.
    rlm_line.__doc__ = "The rlm-magic commands:\n\n" + subcommands.HELP


_ASYNC_CELLS = {"%%rlm": "run_rlm_cell", "%%llm": "run_llm_cell"}


def transform_rlm_cell(lines: list[str]) -> list[str]:
    """Input transformer: ``%%rlm ARGS\\nQUERY`` -> ``await <run the magic>`` (and the
    same for ``%%llm``).

    ``%%rlm?`` and ``%%rlm??`` are left alone so IPython shows the help."""
    if lines and lines[0].split()[:2] == ["%rlm", "eval"]:  # awaited, as %%rlm is
        words = lines[0].split(None, 2)
        run = "__import__('rlm_magic.jupyter.subcommands').jupyter.subcommands.run_eval"
        return [f"await {run}({(words[2] if len(words) > 2 else '').strip()!r})\n", *lines[1:]]
    if not lines or lines[0][:5] not in _ASYNC_CELLS:
        return lines
    first = lines[0].rstrip("\n")
    if first.rstrip().endswith("?") or not (len(first) == 5 or first[5:6].isspace()):
        return lines
    args, body = first[5:].strip(), "".join(lines[1:])
    run = f"__import__('rlm_magic.jupyter.magics').jupyter.magics.{_ASYNC_CELLS[first[:5]]}"
    return [f"await {run}({args!r}, {body!r})\n"]


# IPython's check_complete (terminal IPython, and the kernel's answer to jupyter
# console's is_complete_request) skips transformers marked this way. Unmarked, the
# rewrite above would hide the "%%" from its rule that a cell magic is incomplete until
# a blank line, and Enter after the %%rlm line would run a cell with no question.
# (An attribute functions do not declare, hence the cast.)
cast(Any, transform_rlm_cell).has_side_effects = True


def _loaded(shell: Any) -> tuple[Any, Any]:
    """This IPython (``shell``, or the running one) and its ``RLMMagics``; a UsageError
    if rlm_magic is not loaded there."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    magics = shell.magics_manager.registry.get("RLMMagics")
    if magics is None:
        raise UsageError("rlm_magic is not loaded: run %load_ext rlm_magic")
    return shell, magics


async def run_rlm_cell(line: str, body: str, shell: Any = None) -> None:
    """What a ``%%rlm`` cell runs: parse, run on this loop, store, display."""
    shell, magics = _loaded(shell)
    args = parse_argstring(magics.rlm_cell, line)
    options = _checked_options(args)
    context = _resolve_variable(shell.user_ns, args.context) if args.context else None
    query = body if args.no_interpolate else _interpolate(body, shell.user_ns)
    if not query.strip():
        raise UsageError("%%rlm needs a question in the cell body, below the %%rlm line")

    rlm = magics.rlm
    session = None
    if args.session:
        session = rlm.session(args.session, options["sandbox"])
    try:
        if session is not None:
            session.claim(asyncio.get_running_loop())
        run = rlm.start(
            query.strip(),
            context,
            namespace=shell.user_ns if args.live else None,
            session=session,
            **options,
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    from .progress import RunStatus

    try:
        with RunStatus(run, enabled=rlm.progress, result_shown=not args.quiet):
            result = await run_interruptibly(run.execute())
    except (KeyboardInterrupt, asyncio.CancelledError) as stop:
        run.result.stop_reason = "interrupted"
        run.result.error = "interrupted by the user"
        shell.user_ns[args.out] = run.result
        if isinstance(stop, KeyboardInterrupt):
            raise interrupt(
                f"%%rlm {_where_stopped(run)}; the partial result is in {args.out}"
            ) from None
        raise
    shell.user_ns[args.out] = result
    from IPython.display import display

    if result.success:
        if not args.quiet:
            display(result)
        return None
    # A failed run: what it got to (an answer, its iterations) shows without the error,
    # and the error follows once, as the cell's one line. With nothing to show, nothing
    # is drawn but the error.
    if not args.quiet and (result.final_answer is not None or result.trajectory):
        display(result.without_error())
    failure = result.as_exception(kept_in=args.out)
    if not args.no_raise:
        raise failure
    print(f"{type(failure).__name__}: {failure}", file=sys.stderr)
    return None


async def run_llm_cell(line: str, body: str, shell: Any = None) -> None:
    """What a ``%%llm`` cell runs: parse, ask, store the answer's text, show it."""
    shell, magics = _loaded(shell)
    args = parse_argstring(magics.llm_cell, line)
    if not args.out.isidentifier() or keyword.iskeyword(args.out):
        raise UsageError(f"--out needs a variable name, got {args.out!r}")
    if args.model is not None and not args.model.strip().strip("'\""):
        raise UsageError("--model needs a model name")
    question = body if args.no_interpolate else _interpolate(body, shell.user_ns)
    if not question.strip():
        raise UsageError("%%llm needs a question in the cell body, below the %%llm line")
    from .llm_cell import ask

    answer = await ask(
        magics.rlm,
        question.strip(),
        model=args.model and args.model.strip("'\""),
        system=args.system,
        quiet=args.quiet,
    )
    shell.user_ns[args.out] = answer.text
    return None


def _where_stopped(run: Run) -> str:
    """Where an interrupt caught the run, counted as the status line counts it, and, if
    the result holds fewer (the reply was still streaming in), how many it holds."""
    finished = len(run.result.trajectory)
    current = max(run.tree.iteration, finished)
    if current == 0:
        return "interrupted before its first iteration"
    most = run.tree.max_iterations or run.max_iterations
    if current == finished:
        return f"interrupted in iteration {current}/{most}"
    # The model was still writing this iteration's reply: the result does not hold it.
    return (
        f"interrupted in iteration {current}/{most}, before its reply was complete "
        f"(the partial result holds {finished} iteration{'' if finished == 1 else 's'})"
    )


def _checked_options(args: argparse.Namespace) -> dict[str, Any]:
    if not args.out.isidentifier() or keyword.iskeyword(args.out):
        raise UsageError(f"--out needs a variable name, got {args.out!r}")
    if args.max_iterations is not None and args.max_iterations < 1:
        raise UsageError(f"--max-iterations must be >= 1, got {args.max_iterations}")
    if args.max_depth is not None and args.max_depth < 0:
        raise UsageError(f"--max-depth must be >= 0, got {args.max_depth}")
    for flag, value in (("--model", args.model), ("--sub-model", args.sub_model)):
        if value is not None and not value.strip().strip("'\""):
            raise UsageError(f"{flag} needs a model name")
    if args.session is not None and not args.session.strip():
        raise UsageError("--session needs a name")
    if args.session and args.live:
        raise UsageError(
            "--session keeps a REPL of its own, so it cannot run in the "
            "notebook's namespace: drop --session or --live"
        )
    if args.live and args.sandbox not in (None, "none"):
        raise UsageError(
            "--live runs the model's code in the notebook's namespace, so it "
            "cannot run in a sandbox: drop --sandbox or --live"
        )
    return {
        "model": args.model,
        "sub_model": args.sub_model,
        "max_iterations": args.max_iterations,
        "max_depth": args.max_depth,
        "sandbox": args.sandbox,
    }


def _resolve_variable(namespace: Mapping[str, Any], dotted: str) -> Any:
    """``name`` or ``name.attr.attr`` from the notebook's namespace."""
    head, *attrs = dotted.split(".")
    if not head.isidentifier():
        raise UsageError(f"--context needs a variable name, got {dotted!r}")
    if head not in namespace:
        raise UsageError(f"--context: no variable named {head!r} in the notebook")
    value = namespace[head]
    for attr in attrs:
        if not hasattr(value, attr):
            raise UsageError(
                f"--context: {type(value).__name__} {head!r} has no attribute {attr!r}"
            )
        value = getattr(value, attr)
    return value


class _NotebookVariables(dict[str, Any]):
    def __init__(self, namespace: Mapping[str, Any]) -> None:
        super().__init__()
        self.namespace = namespace

    def __missing__(self, key: str) -> Any:
        if key in self.namespace:
            return self.namespace[key]
        raise UsageError(
            f"the query refers to {{{key}}}, but there is no variable named "
            f"{key!r} (write {{{{{key}}}}} for literal braces, or use "
            "--no-interpolate)"
        )


def _interpolate(body: str, namespace: Mapping[str, Any]) -> str:
    try:
        return string.Formatter().vformat(body, (), _NotebookVariables(namespace))
    except UsageError:
        raise
    except (ValueError, IndexError, KeyError, AttributeError, TypeError) as exc:
        raise UsageError(
            f"cannot fill {{variables}} into the query ({exc}); write {{{{ "
            "and }} for literal braces, or use --no-interpolate"
        ) from None
