"""The ``%rlm`` line magic's subcommands: ``config``, ``usage``, ``demo``, ``help``."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from IPython.core.error import UsageError

from .._terminal_text import visible

if TYPE_CHECKING:
    from ..eval import Evaluation
    from ..rlm.runner import RLM


class BoundMagics(Protocol):
    """What a subcommand reads of the magics: the session's ``RLM``."""

    rlm: RLM


HELP = """\
%rlm config         show the effective settings (secrets masked)
%rlm keys           which providers have their keys set in the environment (no values)
%rlm usage          tokens and cost per model for this session
%rlm usage --reset  ... and start counting again
%rlm sessions       sessions (%%rlm --session NAME) with their size and cost
%rlm forget NAME    end a session (its sandbox process too)
%rlm jobs           provider batch jobs (batch_job=True) with state, counts, cost
%rlm jobs cancel ID cancel one at its provider
%rlm eval [--tasks niah,count --sizes 8k,64k --n 20 --methods rlm,direct,map --dry-run
          --out VAR --jsonl PATH --max-cost USD --seed N]
                    does the RLM help? RLM vs a direct call vs a chunked map, scored
%rlm demo           start the offline demo model and point RLM at it
%rlm demo stop      stop it and restore the previous settings
%rlm help           this text
%%llm [-m MODEL]    one question to a model, its answer shown as Markdown (%%llm? for more)
Set options with %config RLM.<name> = value; see %config RLM."""


def dispatch(magics: BoundMagics, line: str) -> object:
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"%rlm: cannot read the arguments ({exc})") from None
    command, rest = (words[0], words[1:]) if words else ("help", [])
    handler = _COMMANDS.get(command)
    if handler is None:
        raise UsageError(
            f"unknown %rlm subcommand {command!r}; choose from {', '.join(sorted(_COMMANDS))}"
        )
    return handler(magics, rest)


def _config(magics: BoundMagics, args: list[str]) -> object:
    _no_args("config", args)
    from .display import SettingsView

    return SettingsView(magics.rlm.settings())


def _keys(magics: BoundMagics, args: list[str]) -> object:
    _no_args("keys", args)
    import os

    from .display import PROVIDER_KEYS, KeysView

    rlm = magics.rlm
    models: dict[str, list[str]] = {}
    for setting, model in (("RLM.model", rlm.model), ("RLM.sub_model", rlm.effective_sub_model)):
        provider = _provider_of(model)
        if provider in PROVIDER_KEYS:
            models.setdefault(provider, []).append(setting)
    return KeysView(os.environ, models, api_key_set=bool(rlm.api_key))


def _provider_of(model: str) -> str | None:
    """The provider a model string names: its prefix, or litellm's reading of it where
    litellm is already imported (importing it here would take seconds)."""
    import sys

    prefix, slash, _ = model.partition("/")
    if slash:
        return prefix
    litellm = sys.modules.get("litellm")
    if litellm is None:
        return "openai" if model.startswith(("gpt-", "o1", "o3", "o4")) else None
    try:
        return str(litellm.get_llm_provider(model)[1])
    except Exception:  # noqa: BLE001 - a model litellm does not know: no provider
        return None


def _usage(magics: BoundMagics, args: list[str]) -> object:
    from ..llm.usage import SESSION_LEDGER, usage

    if args == ["--reset"]:
        SESSION_LEDGER.clear()
        return None
    _no_args("usage", args)
    from .display import UsageView

    return UsageView(usage())


def _demo(magics: BoundMagics, args: list[str]) -> object:
    from .. import demo

    if args == ["stop"]:
        demo.stop(magics.rlm)
        return None
    _no_args("demo", args)
    demo.start(magics.rlm)
    # No port in the message: notebooks re-run under nbval must print the same text.
    print(
        f"Demo model running on 127.0.0.1: a scripted stand-in, not a language model.\n"
        f"RLM.model = {magics.rlm.model!r}, RLM.sub_model = {magics.rlm.sub_model!r}. "
        "`%rlm demo stop` restores your settings."
    )
    return None


def _sessions(magics: BoundMagics, args: list[str]) -> object:
    _no_args("sessions", args)
    from ..rlm.session import SessionsView

    return SessionsView(list(magics.rlm.sessions.values()))


def _forget(magics: BoundMagics, args: list[str]) -> object:
    if len(args) != 1:
        raise UsageError("%rlm forget takes one session name")
    session = magics.rlm.sessions.pop(args[0], None)
    if session is None:
        names = ", ".join(magics.rlm.sessions) or "none"
        raise UsageError(f"no session named {args[0]!r} (sessions: {names})")
    session.close_soon()
    print(f"Session {args[0]!r} ended.")
    return None


def _jobs(magics: BoundMagics, args: list[str]) -> object:
    from ..maps import jobs

    if args[:1] == ["cancel"]:
        if len(args) != 2:
            raise UsageError("%rlm jobs cancel takes one job id")
        try:
            record = jobs.cancel(magics.rlm.cache_dir, args[1], magics.rlm)
        except Exception as exc:  # noqa: BLE001 - one line, whatever failed
            from ..errors import describe_exception

            raise UsageError(f"%rlm jobs cancel: {describe_exception(exc)}") from None
        print(visible(f"Batch job {record.id}: {record.state}"))  # as the provider said
        return None
    _no_args("jobs", args)
    from .job_progress import JobsView

    return JobsView(jobs.JobStore(magics.rlm.cache_dir).all())


def _eval_arguments(args: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="%rlm eval", add_help=False)
    parser.add_argument("--tasks", default="niah,count,pairs,two_hop")
    parser.add_argument("--sizes", default="8k,32k")
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--methods", default="rlm,direct,map")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--jsonl")
    parser.add_argument("--max-cost", type=float)
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--chunk-tokens", type=int)
    try:
        return parser.parse_args(args)
    except SystemExit:  # argparse printed what was wrong
        raise UsageError("%rlm eval: see %rlm help for its options") from None


def _evaluation(magics: BoundMagics, options: argparse.Namespace) -> Evaluation:
    from ..eval import Evaluation

    return Evaluation(
        magics.rlm,
        options.tasks,
        options.sizes,
        options.n,
        options.methods,
        seed=options.seed,
        max_cost_usd=options.max_cost,
        concurrency=options.concurrency,
        jsonl=options.jsonl,
        chunk_tokens=options.chunk_tokens,
    )


def _eval(magics: BoundMagics, args: list[str]) -> object:
    options = _eval_arguments(args)
    if not options.dry_run:
        raise UsageError(
            "%rlm eval runs on the notebook's event loop: put it at the start of a cell "
            "of its own, or use `await rlm_magic.eval.evaluate(...)`"
        )
    from .. import demo

    # The demo's pretend prices, for the plan: registered within a moment of `%rlm demo`
    # (a cell that starts with %rlm eval waits for them off the loop; this is on it).
    demo.wait_until_priced(timeout=0.5)
    return _evaluation(magics, options).plan


async def run_eval(line: str, shell: Any = None) -> object:
    """What a cell starting ``%rlm eval`` runs (rewritten to ``await`` it, as ``%%rlm``
    is): the plan, then every item with a progress bar; the table and the plot."""
    import asyncio

    from IPython import get_ipython
    from IPython.display import Image, display

    from .. import demo
    from .interrupts import run_interruptibly
    from .progress import BatchProgress

    shell = shell or get_ipython()
    magics = shell.magics_manager.registry.get("RLMMagics")
    if magics is None:
        raise UsageError("rlm_magic is not loaded: run %load_ext rlm_magic")
    options = _eval_arguments(shlex.split(line))
    await asyncio.to_thread(demo.wait_until_priced)  # the demo's prices, for the plan
    evaluation = _evaluation(magics, options)
    if options.dry_run:
        return evaluation.plan
    print(evaluation.plan.summary())
    if options.out:
        shell.user_ns[options.out] = evaluation.results  # fills as items finish
    progress = BatchProgress(len(evaluation.units), "eval", enabled=magics.rlm.progress)
    try:
        with progress:
            await run_interruptibly(evaluation.run(progress), "%rlm eval")
    except KeyboardInterrupt:
        kept = f"; they are in {options.out}" if options.out else ""
        print(f"Interrupted: {len(evaluation.results)} items had finished{kept}.")
        raise
    png = evaluation.results.plot_png()
    if png is not None:
        display(Image(png))
    return evaluation.results


def _help(magics: BoundMagics, args: list[str]) -> object:
    print(HELP)
    return None


def _no_args(command: str, args: list[str]) -> None:
    if args:
        raise UsageError(f"%rlm {command} takes no arguments, got {' '.join(args)!r}")


_COMMANDS: dict[str, Callable[[BoundMagics, list[str]], object]] = {
    "config": _config,
    "keys": _keys,
    "usage": _usage,
    "demo": _demo,
    "help": _help,
    "sessions": _sessions,
    "forget": _forget,
    "jobs": _jobs,
    "eval": _eval,
}
