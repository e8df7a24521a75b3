"""The RLM loop: a root model answers a question by writing code in a REPL where the
context is a variable, calling sub-models on pieces of it, until it gives FINAL(...).

``RLM`` is both the traitlets configurable users set (``%config RLM.model = ...``) and
the engine: ``await RLM(...).arun(query, context=...)``. Each ``arun`` builds a ``Run``
holding all of its state, so several runs of one ``RLM`` may go on at once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import RLMConfig
from ..errors import ConfigError, LLMQueryError, PromptTooLongError, describe_exception
from ..llm.batch import gather_limited
from ..llm.client import LLMClient, close_loop_clients, redact_messages
from ..llm.limiter import ConcurrencyLimiter
from ..llm.messages import build_messages
from ..llm.redaction import off_loop_if_large
from ..llm.usage import SESSION_LEDGER, UsageLedger
from ..llm.windows import CHARS_PER_TOKEN, estimate_tokens, is_context_error, reserve_for_answer
from ..repl.inprocess import AsyncREPL
from ..repl.sandbox import SandboxREPL
from ..repl.steps import preloaded, repl_builtins
from .live_turn import LiveTurn
from .prompts import (
    AFTER_COMPACTION_PROMPT,
    CONTINUE_PROMPT,
    ITERATION_LIMIT_PROMPT,
    SUMMARY_PROMPT,
    SYSTEM_PROMPT,
    chunk_advice,
    code_blocks,
    describe_context,
    find_final,
)
from .result import CodeRun, Compaction, Iteration, RLMResult
from .session import RLMSession

if TYPE_CHECKING:
    from ..jupyter.helpers import NotebookHelpers

_run_ids = itertools.count(1)


class RLM(RLMConfig):
    """Recursive Language Model runner and the ``RLM`` settings of rlm-magic."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._client: LLMClient | None = None
        self._helpers: "NotebookHelpers | None" = None
        self.sessions: dict[str, RLMSession] = {}

    @property
    def client(self) -> LLMClient:
        """The client all calls of this RLM go through (one limit, one ledger)."""
        if self._client is None:
            self._client = LLMClient(self, UsageLedger(parent=SESSION_LEDGER))
        return self._client

    @property
    def helpers(self) -> "NotebookHelpers":
        if self._helpers is None:
            from ..jupyter.helpers import NotebookHelpers  # the notebook side, on demand

            self._helpers = NotebookHelpers(self)
        return self._helpers

    def usage(self):
        """Usage of every call made through this RLM."""
        return self.client.ledger.summary()

    def session(self, name: str = "session", sandbox: str | None = None) -> RLMSession:
        """The session called ``name``, started on first use."""
        existing = self.sessions.get(name)
        if existing is None or existing.closed:
            existing = self.sessions[name] = RLMSession(self, name, sandbox)
        return existing

    async def forget(self, name: str) -> bool:
        """End the session ``name`` (its sandbox process too); False if there is none."""
        session = self.sessions.pop(name, None)
        if session is None:
            return False
        await session.aclose()
        return True

    def start(self, query: str, context: Any = None, **overrides) -> "Run":
        """A run, not yet started: ``await run.execute()``; ``run.result`` is kept up
        to date, so a caller still has the partial result after an interrupt."""
        return Run(self, query, context, **overrides)

    async def arun(self, query: str, context: Any = None, *, model: str | None = None,
                   sub_model: str | None = None, max_iterations: int | None = None,
                   max_depth: int | None = None,
                   namespace: dict[str, Any] | None = None,
                   sandbox: str | None = None,
                   session: "RLMSession | str | None" = None) -> RLMResult:
        """Answer ``query`` about ``context``; returns an ``RLMResult`` (check ``.success``).

        ``session``: an ``RLMSession`` (or the name of one of this RLM's) to carry on
        in: its REPL variables, contexts and earlier answers are there for this question.

        ``namespace``: run the REPL in this dict instead of a fresh one (what ``--live``
        does with the notebook's namespace); such a run is never sandboxed.
        ``sandbox``: "process" or "none" for this run (default: ``RLM.sandbox``).
        """
        return await self.start(query, context, model=model, sub_model=sub_model,
                                max_iterations=max_iterations, max_depth=max_depth,
                                namespace=namespace, sandbox=sandbox,
                                session=session).execute()

    async def _run_and_close(self, query: str, context: Any, **overrides) -> RLMResult:
        try:
            return await self.arun(query, context, **overrides)
        finally:
            await close_loop_clients()  # this loop ends with the run: so do its connections

    def run(self, query: str, context: Any = None, **overrides) -> RLMResult:
        """Blocking ``arun``, for scripts. In a notebook, ``await rlm.arun(...)``."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            if overrides.get("session") is not None:
                raise ConfigError(
                    "RLM.run() cannot carry a session: each call runs on an event loop of "
                    "its own, and a session's REPL lives on one; use `await rlm.arun(..., "
                    "session=...)`, e.g. inside one asyncio.run for all the questions")
            return asyncio.run(self._run_and_close(query, context, **overrides))
        raise RuntimeError("RLM.run() cannot be used inside a running event loop (such as "
                           "a notebook cell): use `await rlm.arun(...)` instead")


@dataclass
class RunTree:
    """What a run shares with its child runs: ledger, sub-call budget, and the counts
    the status panel shows (read by it a few times a second)."""

    ledger: UsageLedger
    max_sub_calls: int
    max_cost_usd: float | None
    sub_calls: int = 0
    in_flight: int = 0
    done: int = 0
    failed: int = 0
    phase: str = "starting"
    warned_unpriced: bool = False
    iteration: int = 0
    max_iterations: int = 0
    live_turn: LiveTurn | None = None  # the root turn streaming in, for the panel

    def sub_calls_left(self) -> int:
        return self.max_sub_calls - self.sub_calls

    def take_sub_calls(self, wanted: int) -> int:
        """Reserve up to ``wanted`` sub-calls; returns how many are allowed."""
        allowed = max(0, min(wanted, self.max_sub_calls - self.sub_calls))
        self.sub_calls += allowed
        return allowed

    def call_started(self) -> None:
        self.in_flight += 1

    def call_ended(self, failed: bool = False) -> None:
        self.in_flight -= 1
        self.failed += failed
        self.done += not failed

    def over_budget(self) -> bool:
        return self.max_cost_usd is not None and self.ledger.cost_usd > self.max_cost_usd


class Run:
    """One RLM run (root or child): its REPL, messages and result."""

    def __init__(self, rlm: RLM, query: str, context: Any = None, *,
                 model: str | None = None, sub_model: str | None = None,
                 max_iterations: int | None = None, max_depth: int | None = None,
                 namespace: dict[str, Any] | None = None, sandbox: str | None = None,
                 depth: int = 0, tree: RunTree | None = None,
                 deadline: float | None = None,
                 session: RLMSession | str | None = None):
        self.rlm = rlm
        if isinstance(session, str):
            session = rlm.session(session, sandbox)
        if session is not None and namespace is not None:
            raise ConfigError("a session keeps a REPL of its own: it cannot run in the "
                              "notebook's namespace (--live)")
        self.session = session
        self.id = next(_run_ids)
        self.query = query
        self.context = context
        self.depth = depth
        # Settings are read once, so a %config during the run cannot change it halfway.
        self.model = model or rlm.model
        self.sub_model = sub_model or rlm.effective_sub_model
        self.max_iterations = max_iterations if max_iterations is not None else rlm.max_iterations
        self.max_depth = max_depth if max_depth is not None else rlm.max_depth
        self.step_timeout = rlm.step_timeout
        self.max_output_chars = rlm.max_output_chars
        self.max_tokens = rlm.max_tokens
        self.tree = tree or RunTree(UsageLedger(parent=rlm.client.ledger),
                                    rlm.max_sub_calls, rlm.max_cost_usd)
        self.namespace = namespace
        self.sandbox = "none" if namespace is not None else (sandbox or rlm.sandbox)
        if session is not None:
            if sandbox is not None and sandbox != session.sandbox:
                where = ("in a sandbox process" if session.sandbox == "process"
                         else "in this kernel")
                raise ConfigError(f"session {session.name!r} runs its code {where}; it "
                                  f"cannot switch to sandbox={sandbox!r}")
            self.sandbox = session.sandbox  # the REPL it keeps
        if self.sandbox not in ("process", "none"):
            raise ValueError(f"sandbox must be 'process' or 'none', got {self.sandbox!r}")
        self.own_sub_calls = 0
        self.cut_answers = 0  # sub-call answers that stopped at max_tokens
        # time.monotonic() by which this run's calls must end: a child run inherits its
        # parent's step deadline; each step of its own sets a nearer one.
        self.outer_deadline = deadline
        self._step_deadline: float | None = None
        self._ready: str | None = None  # the model's `answer`, once its code set it ready
        self.early_execution = rlm.early_execution and rlm.stream
        self.result = RLMResult(query=query, model=self.model, sub_model=self.sub_model,
                                depth=depth, sandbox=self.sandbox)

    @property
    def client(self) -> LLMClient:
        return self.rlm.client

    # -- the loop ---------------------------------------------------------------------
    async def execute(self) -> RLMResult:
        session = self.session
        if session is None:
            return await self._execute()
        session.claim(asyncio.get_running_loop())
        async with session._busy:
            try:
                return await self._execute()
            finally:
                session.record(self.result)  # failed or interrupted runs too

    async def _execute(self) -> RLMResult:
        started = time.perf_counter()
        result = self.result
        live = self.namespace is not None
        namespace = self.namespace if live else {"__name__": "__rlm__",
                                                 "__builtins__": repl_builtins()}
        saved, touched = {}, []
        preexisting = set(namespace) if live else set()  # the notebook's own variables
        try:
            injected = self._repl_globals(namespace)
            touched = [*injected, *self._repl_helpers(), "__rlm_async__", "history"]
            if live:
                saved = {name: namespace[name] for name in touched if name in namespace}
            if self.session is not None:
                await self._session_repl(self.session, namespace, injected)
            elif self.sandbox == "process":
                self.repl = SandboxREPL(self.context, self._repl_helpers(),
                                        memory_mb=self.rlm.sandbox_memory_mb,
                                        max_output_chars=self.max_output_chars,
                                        secrets=tuple(self.rlm.configured_secrets()),
                                        settings=self.rlm,
                                        sub_calls_left=self.tree.sub_calls_left)
                await self.repl.start()  # the process starts while the root model thinks
            else:
                namespace.update(injected)
                self.repl = AsyncREPL(namespace, self._repl_helpers())
            await self._loop(result)
        except asyncio.CancelledError:
            result.stop_reason, result.error = "interrupted", "interrupted by the user"
            raise
        except Exception as exc:  # noqa: BLE001 - the run fails, the result keeps it
            result.stop_reason, result.error = "error", describe_exception(exc)
        finally:
            if hasattr(self, "repl"):
                await self._close_repl(result, preexisting)
            if live:
                for name in touched:
                    namespace.pop(name, None)
                namespace.update(saved)
            if result.stop_reason == "final" and _is_error(result.final_answer):
                # The answer is a failed call's error string: that is not an answer.
                result.stop_reason = "error"
                result.error = ("the final answer is an error message, not an answer: "
                                + " ".join(result.final_answer.split())[:300])
            result.success = result.stop_reason == "final"
            result.iterations = len(result.trajectory)
            result.usage = self.tree.ledger.summary()
            result.elapsed_s = time.perf_counter() - started
        return result

    async def _session_repl(self, session: RLMSession, namespace: dict[str, Any],
                            injected: dict[str, Any]) -> None:
        """The session's REPL, made by its first run and kept: a new context joins the
        earlier ones as context_N and becomes `context`."""
        fresh = self.context is not None
        context = self.context if fresh else session.context
        names = [f"context_{len(session.contexts)}", "context"] if fresh else []
        helpers = self._repl_helpers()
        if session.repl is None:
            if self.sandbox == "process":
                # The session owns it from the start: whatever happens next, it is closed.
                self.repl = session.repl = SandboxREPL(
                    context, helpers, memory_mb=self.rlm.sandbox_memory_mb,
                    max_output_chars=self.max_output_chars,
                    secrets=tuple(self.rlm.configured_secrets()), context_names=names[:1],
                    settings=self.rlm, sub_calls_left=self.tree.sub_calls_left)
                try:
                    await self.repl.start()
                except BaseException:
                    session.repl = None  # the run's end closes it; the next run starts anew
                    raise
            else:
                namespace.update(injected)
                namespace.update({name: context for name in names})
                session.namespace = namespace
                self.repl = session.repl = AsyncREPL(namespace, helpers)
        else:
            self.repl = session.repl
            self.repl.rebind(helpers)
            await self.repl.set_variable("answer", {"content": "", "ready": False})
            if names:
                await self.repl.set_context(context, names)
        if fresh:  # only once the REPL has it: a failed delivery leaves the session as it was
            session.contexts.append(context)
        self.context = context

    async def _close_repl(self, result: RLMResult, preexisting: set[str]) -> None:
        """Close the REPL, keeping the model's variables whatever ended the run:
        answers already paid for stay reachable as result.variables. A session's REPL
        stays open for its next question."""
        result.network_isolated = getattr(self.repl, "network_isolated", None)
        result.isolation = getattr(self.repl, "isolation", None)
        try:
            variables = await self.repl.variables()
            result.variables = {name: value for name, value in variables.items()
                                if name not in preexisting}
        finally:
            if self.session is None or self.session.repl is not self.repl:
                await self.repl.aclose()  # stopped steps may send nothing more

    async def _loop(self, result: RLMResult) -> None:
        # litellm's model info gives the windows the prompt advises by.
        await self.client.look_up_windows(self.model, self.sub_model)
        self._messages = [{"role": "system", "content": self._system_prompt()},
                          {"role": "user", "content": self._first_message()}]
        self._history = list(self._messages)  # every message, compactions or not
        self._compacted_length = len(self._messages)
        self._compacted_size = estimate_tokens(self._messages)
        for index in range(1, self.max_iterations + 1):
            self._status("thinking", iteration=index)
            turn_started = time.perf_counter()
            calls_before = self.own_sub_calls
            iteration, outputs = Iteration(index=index, response=""), []

            def new_turn(iteration=iteration, outputs=outputs):
                return LiveTurn((lambda n, code: self._run_block(n, code, iteration, outputs))
                                if self.early_execution else None)

            reply, turn = await self._root_turn(index, iteration, new_turn)
            iteration.response = reply
            result.trajectory.append(iteration)
            feedback, final = await self._act_on(reply, iteration, turn, outputs)
            if iteration.broken_off:
                feedback = (f"(Your reply was cut off after its code had run: "
                            f"{iteration.broken_off}. Its output is below.)\n\n{feedback}")
            iteration.sub_calls = self.own_sub_calls - calls_before
            iteration.elapsed_s = time.perf_counter() - turn_started
            if final is not None:
                result.final_answer, result.stop_reason = final, "final"
                return
            if self._stopped_by_budget(result):
                return
            exchange = [{"role": "assistant", "content": reply},
                        {"role": "user", "content": feedback}]
            self._messages += exchange
            self._history += exchange

        # Out of iterations: one last chance to answer, without running code.
        self._status("thinking", iteration=self.max_iterations)
        reply, _ = await self._root_turn(
            self.max_iterations + 1, None, LiveTurn,
            extra=[{"role": "user", "content": ITERATION_LIMIT_PROMPT}])
        marker = find_final(reply)
        answer = (await self._resolve_final(marker))[0] if marker else None
        if answer is not None:
            result.final_answer, result.stop_reason = answer, "final"
        else:
            result.final_answer = reply.strip() or None
            result.stop_reason = "max_iterations"
            result.error = (f"no FINAL answer within max_iterations={self.max_iterations}; "
                            "final_answer holds the model's last reply")

    # -- a conversation that fits the root model's window ------------------------------
    async def _root_turn(self, index: int, iteration: Iteration | None, new_turn,
                         extra: list[dict] = ()) -> tuple[str, LiveTurn]:
        """A root turn on the conversation, compacted first when it nears the model's
        window; a context-length error compacts it once more and tries again."""
        await self._compact_if_near_window(index, iteration)
        turn = new_turn()
        try:
            return await self._ask_root(self._messages + list(extra), turn, iteration), turn
        except LLMQueryError as exc:
            if not is_context_error(exc) or turn.ran:
                raise
        await self._compact(index, iteration, "context error")
        turn = new_turn()
        return await self._ask_root(self._messages + list(extra), turn, iteration), turn

    def _room(self) -> int | None:
        """Tokens the root model takes as a prompt (its window less the answer's)."""
        window = self.client.input_window(self.model)
        if window is None:
            return None
        return window - reserve_for_answer(window, self.max_tokens)

    async def _compact_if_near_window(self, index: int, iteration: Iteration | None) -> None:
        room = self._room()
        # Only a conversation that grew since it started (or was last compacted), and
        # by a quarter of the room: when the question and a summary alone sit near the
        # threshold, each turn would otherwise pay for another summary.
        if room is None or len(self._messages) <= self._compacted_length:
            return
        size = estimate_tokens(self._messages)
        if size > self.rlm.compact_at * room and size - self._compacted_size >= room / 4:
            await self._compact(index, iteration, "threshold")

    async def _share_history(self) -> None:
        """The whole conversation as the REPL variable ``history``, redacted as all that
        the model's code can see is (the sandbox's code must not read a secret either)."""
        shared = await redact_messages([dict(m) for m in self._history],
                                       self.client.redactor())
        await self.repl.set_variable("history", shared)

    async def _compact(self, index: int, iteration: Iteration | None, reason: str) -> None:
        """The root model summarises its progress; the conversation restarts from the
        system prompt, the question and that summary. The full history goes into the
        REPL variable ``history`` first, so nothing the model saw is lost."""
        self._status("compacting")
        before = estimate_tokens(self._messages)
        await self._share_history()
        room = self._room() or max(256, before // 2)
        for share in (0.8, 0.4):  # the estimate may be short for code: then less
            request = _with_user_message(_fitted(self._messages, int(room * share)),
                                         SUMMARY_PROMPT)
            try:
                completion = await self.client.complete(
                    request, model=self.model, max_tokens=self.max_tokens,
                    ledger=self.tree.ledger, deadline=self.outer_deadline)
                break
            except LLMQueryError as exc:
                if share == 0.4 or not is_context_error(exc):
                    raise
                room = self._room() or room  # the error may have taught the window
        summary = completion.text.strip() or "(the model wrote no summary)"
        number = len(self.result.compactions) + 1
        self._history += [{"role": "user", "content": SUMMARY_PROMPT},
                          {"role": "assistant", "content": summary}]
        self._messages = [*self._messages[:2], {"role": "assistant", "content": summary},
                          {"role": "user",
                           "content": AFTER_COMPACTION_PROMPT.format(number=number)}]
        await self._share_history()
        self._compacted_length = len(self._messages)
        self._compacted_size = estimate_tokens(self._messages)
        record = Compaction(index, reason, before, estimate_tokens(self._messages),
                            completion.input_tokens, completion.output_tokens,
                            completion.cost_usd, summary)
        self.result.compactions.append(record)
        if iteration is not None:
            iteration.compaction = record
        self._status("thinking")

    async def _ask_root(self, messages, turn: LiveTurn | None = None,
                        iteration: Iteration | None = None) -> str:
        """One root turn, streamed into ``turn`` (the panel shows it; with early
        execution its finished blocks start running). If the turn fails after some of
        its blocks ran, it is not asked again (its code would run twice): the partial
        turn stands, with its outputs, and the model is told where it was cut off."""
        turn = turn if turn is not None else LiveTurn()
        if self.depth == 0:
            self.tree.live_turn = turn
        try:
            completion = await self.client.complete(
                messages, model=self.model, max_tokens=self.max_tokens,
                ledger=self.tree.ledger, stream=True, on_text=turn, cache_prefix=True,
                deadline=self.outer_deadline, may_retry=lambda: not turn.ran)
        except BaseException as exc:
            if turn.ran and iteration is not None and isinstance(exc, Exception):
                # Cut off after its code ran: the partial turn stands, and _act_on lets
                # its blocks finish.
                iteration.broken_off = describe_exception(exc)
                iteration.early_blocks = turn.ran
                return turn.text
            await turn.cancel()
            if turn.ran and iteration is not None:  # interrupted: keep what ran
                iteration.response = turn.text
                self.result.trajectory.append(iteration)
            raise
        finally:
            if self.depth == 0:
                self.tree.live_turn = None
        if iteration is not None:
            iteration.early_blocks = turn.ran
        return completion.text

    async def _act_on(self, reply: str, iteration: Iteration, turn: LiveTurn | None = None,
                      outputs: list[str] | None = None) -> tuple[str, str | None]:
        """Run the reply's code; return (feedback for the model, final answer or None)."""
        blocks = code_blocks(reply)
        outputs = outputs if outputs is not None else []
        if turn is not None and self.early_execution:
            await turn.finish(blocks)  # the blocks not started while streaming, in order
            if turn.stopped:
                return "", self._ready
        else:
            for number, code in enumerate(blocks, 1):
                if await self._run_block(number, code, iteration, outputs):
                    return "", self._ready
        marker = find_final(reply)
        if marker is not None:
            answer, problem = await self._resolve_final(marker, iteration)
            if answer is not None:
                return "", answer
            outputs.append(problem)
        if not blocks and marker is None:
            outputs.append("You wrote no ```repl code and gave no FINAL answer.")
        return "\n\n".join(outputs + [CONTINUE_PROMPT]), None

    async def _run_block(self, number: int, code: str, iteration: Iteration,
                         outputs: list[str]) -> bool:
        """Run one block; True when the model's code set the answer ready."""
        self._status("running code")
        # Sub-calls of this step must end in time for the step to end with their
        # results and errors in hand: they get a deadline a little before the step's.
        timeout = self.step_timeout
        if self.outer_deadline is not None:
            # A child run: its step must be stopped, and unwound, before the parent's
            # step ends (a stopped step's thread gets up to half a second to unwind).
            timeout = max(0.1, min(timeout, self.outer_deadline - time.monotonic() - 0.5))
        self._step_deadline = time.monotonic() + timeout - min(2.0, 0.1 * timeout)
        cut_before = self.cut_answers
        try:
            step = await self.repl.run(code, timeout=timeout)
        except BaseException:
            # Interrupted mid-step: keep what the step printed in the trajectory.
            partial = self.repl.last_output
            shown = self.client.redactor().head(partial.as_text(),
                                                self.max_output_chars)
            iteration.code.append(CodeRun(code, shown, partial.elapsed_s, error=True))
            raise
        finally:
            self._step_deadline = None
            if self.tree.live_turn is not None and self.depth == 0:
                self._status("thinking")  # an early block ended; the model still writes
        seen = await self._as_model_sees_it(step.as_text(), step.dropped_chars)
        cut = self.cut_answers - cut_before
        if cut:
            iteration.cut_answers += cut
            seen += (f"\n[{cut} sub-call answer{'s' if cut > 1 else ''} of this step "
                     f"stopped at max_tokens and {'are' if cut > 1 else 'is'}"
                     " cut off; ask for shorter answers or smaller pieces]")
        iteration.code.append(CodeRun(code, seen, step.elapsed_s,
                                      error=step.error is not None))
        outputs.append(f"Output of block {number}:\n{seen}")
        # The REPL (in this process or the sandbox's) says whether `answer` is ready.
        self._ready = await self.repl.ready_answer()
        return self._ready is not None

    async def _resolve_final(self, marker, iteration: Iteration | None = None
                             ) -> tuple[str | None, str]:
        repl = getattr(self, "repl", None)
        if marker.kind == "FINAL":
            # FINAL(name), where name is exactly a REPL variable's: a real model's slip
            # for FINAL_VAR(name). Answer with the value, and say so.
            value = None
            if repl is not None and marker.value.isidentifier():
                try:
                    if marker.value in await repl.variable_names():
                        value = await repl.final_var(marker.value)
                except Exception:  # noqa: BLE001 - a sandbox that cannot say: the text stands
                    value = None
                if value is not None:
                    note = (f"FINAL({marker.value}) names a REPL variable: answered with "
                            "its value, as FINAL_VAR would")
                    if iteration is not None:
                        iteration.notes.append(note)
                    else:
                        self.result.notes.append(note)
                    return value, ""
            return marker.value, ""
        value = await repl.final_var(marker.value) if repl else None
        if value is not None:
            return value, ""
        names = ", ".join(await repl.variable_names() if repl else []) or "none yet"
        return None, (f"FINAL_VAR({marker.value}): there is no variable named "
                      f"{marker.value!r} in the REPL (variables: {names}).")

    def _stopped_by_budget(self, result: RLMResult) -> bool:
        self._warn_if_budget_is_blind()
        if not self.tree.over_budget():
            return False
        result.stop_reason = "budget"
        result.error = (f"cost budget exceeded: spent ${self.tree.ledger.cost_usd:.4f} of "
                        f"max_cost_usd=${self.tree.max_cost_usd:g}")
        return True

    def _warn_if_budget_is_blind(self) -> None:
        tree = self.tree
        if tree.max_cost_usd is None or tree.warned_unpriced:
            return
        unpriced = [row.model for row in tree.ledger.summary().by_model.values()
                    if row.unpriced_calls]
        if unpriced:
            tree.warned_unpriced = True
            import warnings

            warnings.warn(f"max_cost_usd is set, but litellm has no price for "
                          f"{', '.join(unpriced)}: those calls count as $0 against the "
                          "budget", RuntimeWarning, stacklevel=2)

    async def _as_model_sees_it(self, text: str, dropped: int = 0) -> str:
        """Step output as the model sees it: secrets removed, cut to max_output_chars
        with a note. ``dropped``: characters the sandbox already left out."""
        limit = self.max_output_chars
        redact = self.client.redactor()
        if len(text) <= limit:
            return await off_loop_if_large(len(text), redact, text)
        head = await off_loop_if_large(limit, redact.head, text, limit)
        return (head + f"\n... [output cut: {len(text) + dropped - limit:,} more characters not "
                "shown; print smaller slices]")

    # -- prompts ----------------------------------------------------------------------
    def _system_prompt(self) -> str:
        type_name, length, preview = describe_context(self.context)
        window = self.client.input_window(self.sub_model)
        reads, chunk = chunk_advice(
            window - reserve_for_answer(window, self.max_tokens) if window else None,
            CHARS_PER_TOKEN)
        fields = _Fields(context_type=type_name, context_length=length,
                         sub_model_reads=reads, chunk_size=chunk,
                         context_preview=self.client.redactor()(preview),
                         max_depth=self.max_depth, depth_left=self.max_depth - self.depth,
                         max_output_chars=self.max_output_chars)
        template = self.rlm.system_prompt or SYSTEM_PROMPT
        try:
            return template.format_map(fields)
        except (ValueError, IndexError):
            return template  # a custom prompt with literal braces: use it as written

    def _first_message(self) -> str:
        question = (f"Question: {self.query}\n\nThe data is in the REPL variable `context`. "
                    "Look at it before you answer.")
        session = self.session
        if session is None or not session.exchanges:
            return question
        contexts = len(session.contexts)
        earlier = (f" Earlier contexts of this session: "
                   f"{', '.join(f'context_{i}' for i in range(contexts - 1))}."
                   if contexts > 1 else "")
        return f"{session.memory()}\n\n{question}{earlier}"

    # -- the REPL's view --------------------------------------------------------------
    def _repl_globals(self, namespace: dict[str, Any]) -> dict[str, Any]:
        return preloaded(namespace, self.context)

    def _repl_helpers(self) -> dict[str, Any]:
        return {"llm_query": self.llm_query,
                "llm_query_batch": self.llm_query_batch,
                "llm_query_batched": self.llm_query_batch,
                "rlm_query": self.rlm_query,
                "rlm_query_batch": self.rlm_query_batch,
                "rlm_query_batched": self.rlm_query_batch}

    def _status(self, phase: str, iteration: int | None = None) -> None:
        if self.depth == 0:
            self.tree.phase = phase
            if iteration is not None:
                self.tree.iteration = iteration
                self.tree.max_iterations = self.max_iterations

    # -- helpers as model code sees them: pinned model, errors as values -------------
    async def llm_query(self, prompt: Any, model: str | None = None, *,
                        system: str | None = None, max_tokens: int | None = None,
                        **_ignored) -> str:
        """Ask the sub-model one question; a failure comes back as 'Error: ...'."""
        del model  # pinned: generated code may not switch to another model
        if not self._take_sub_calls(1):
            return self._limit_error()
        return await self._sub_call(prompt, system, max_tokens)

    async def llm_query_batch(self, prompts: Any, model: str | None = None, *,
                              system: str | None = None, max_tokens: int | None = None,
                              **_ignored) -> list[str]:
        """Ask many questions concurrently; failures come back as 'Error: ...' in place."""
        del model
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        allowed = self._take_sub_calls(len(prompts))
        redactor = self.client.redactor()
        calls = [(lambda p=p: self._sub_call(p, system, max_tokens, slot_held=True,
                                             redactor=redactor))
                 for p in prompts[:allowed]]
        answers, errors = await gather_limited(calls, self.client.limiter,
                                               _TreeObserver(self.tree))
        answers = [f"Error: {errors[i]}" if i in errors else a for i, a in enumerate(answers)]
        return answers + [self._limit_error()] * (len(prompts) - allowed)

    async def rlm_query(self, prompt: Any, context: Any = None, model: str | None = None,
                        **_ignored) -> str:
        """Solve a sub-problem with a child RLM (or llm_query at the depth limit)."""
        del model
        prompt = prompt if isinstance(prompt, str) else str(prompt)
        if self.depth >= self.max_depth:
            if context is not None:
                prompt = f"{prompt}\n\nContext:\n{context}"
            return await self.llm_query(prompt)
        if not self._take_sub_calls(1):
            return self._limit_error()
        child = Run(self.rlm, prompt, context, model=self.sub_model, sub_model=self.sub_model,
                    max_iterations=self.max_iterations, max_depth=self.max_depth,
                    sandbox=self.sandbox, depth=self.depth + 1, tree=self.tree,
                    deadline=self._step_deadline or self.outer_deadline)
        self.tree.call_started()
        outcome = await child.execute()
        self.tree.call_ended(failed=not outcome.success)
        if outcome.success:
            return outcome.final_answer
        return f"Error: child RLM failed: {outcome.error}"

    async def rlm_query_batch(self, prompts: Any, contexts: Any = None,
                              model: str | None = None, **_ignored) -> list[str]:
        """Run child RLMs concurrently; answers in order, failures as 'Error: ...'."""
        del model
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        contexts = [None] * len(prompts) if contexts is None else list(contexts)
        if len(contexts) != len(prompts):
            return [f"Error: rlm_query_batch got {len(prompts)} prompts and "
                    f"{len(contexts)} contexts"] * len(prompts)
        # Children hold no client slot while they think: a limiter of their own.
        limiter = ConcurrencyLimiter(lambda: self.rlm.max_concurrency)
        calls = [(lambda p=p, c=c: self.rlm_query(p, c)) for p, c in zip(prompts, contexts)]
        answers, errors = await gather_limited(calls, limiter)
        return [f"Error: {errors[i]}" if i in errors else a for i, a in enumerate(answers)]

    async def _sub_call(self, prompt: Any, system: str | None, max_tokens: int | None,
                        slot_held: bool = False, redactor=None) -> str:
        if self.tree.over_budget():
            return (f"Error: cost budget max_cost_usd=${self.tree.max_cost_usd:g} is spent; "
                    "no request was sent")
        prompt = prompt if isinstance(prompt, str) else str(prompt)
        tokens = min(max_tokens, self.max_tokens) if isinstance(max_tokens, int) \
            and max_tokens > 0 else self.max_tokens
        # A batch's items are counted by its observer; a single call counts itself.
        if not slot_held:
            self.tree.call_started()
        try:
            completion = await self.client.complete(
                build_messages(prompt, system if isinstance(system, str) else None),
                model=self.sub_model, max_tokens=tokens, ledger=self.tree.ledger,
                slot_held=slot_held, redactor=redactor,
                # One call at a time streams (its timeout is then a stall timeout);
                # a batch's items do not: per-chunk work times 64 would load the loop.
                stream=not slot_held, deadline=self._step_deadline or self.outer_deadline)
        except Exception as exc:  # noqa: BLE001 - errors are values inside the REPL
            if not slot_held:
                self.tree.call_ended(failed=True)
            if isinstance(exc, PromptTooLongError):
                return (f"Error: prompt is about {exc.tokens:,} tokens, the sub-model takes "
                        f"{exc.room:,}; split it")
            if is_context_error(exc):
                window = self.client.input_window(self.sub_model)
                takes = f" of {window:,} tokens" if window else ""
                return (f"Error: the prompt is over the sub-model's window{takes} (the "
                        "provider refused it); split it")
            return f"Error: {exc}" if isinstance(exc, LLMQueryError) else \
                f"Error: {describe_exception(exc)}"
        if not slot_held:
            self.tree.call_ended()
        if completion.cut_off:
            self.cut_answers += 1
        return completion.text

    def _take_sub_calls(self, wanted: int) -> int:
        allowed = self.tree.take_sub_calls(wanted)
        self.own_sub_calls += allowed
        return allowed

    def _limit_error(self) -> str:
        return (f"Error: max_sub_calls={self.tree.max_sub_calls} reached for this run; "
                "no request was sent")


def _fitted(messages: list[dict], room: int) -> list[dict]:
    """The conversation cut to about ``room`` tokens for its summary: the system prompt
    and question, then the latest exchanges that fit (the oldest are left out whole;
    a single exchange too big alone keeps its head and tail)."""
    head, tail = messages[:2], messages[2:]
    budget = max(64, room - estimate_tokens(head))
    left_out = 0
    while len(tail) > 2 and estimate_tokens(tail) > budget:
        tail, left_out = tail[2:], left_out + 2  # whole (assistant, user) exchanges
    if estimate_tokens(tail) > budget:
        share = max(200, budget * CHARS_PER_TOKEN // max(1, len(tail)))
        tail = [{**m, "content": _head_and_tail(m["content"], share)}
                if isinstance(m.get("content"), str) else m for m in tail]
    if left_out:
        note = {"role": "user", "content": f"[{left_out} earlier messages are left out "
                                           "here to fit your window]"}
        return [*head, {"role": "assistant", "content": "(working)"}, note, *tail]
    return [*head, *tail]


def _with_user_message(messages: list[dict], text: str) -> list[dict]:
    """``text`` as the next user message; joined to the last one if that is the
    user's too (some providers refuse two user messages in a row)."""
    last = messages[-1]
    if last.get("role") == "user" and isinstance(last.get("content"), str):
        return [*messages[:-1], {**last, "content": f"{last['content']}\n\n{text}"}]
    return [*messages, {"role": "user", "content": text}]


def _head_and_tail(text: str, size: int) -> str:
    if len(text) <= size:
        return text
    half = size // 2
    return f"{text[:half]}\n... [{len(text) - size:,} characters cut] ...\n{text[-half:]}"


def _is_error(answer: str | None) -> bool:
    return isinstance(answer, str) and answer.lstrip().startswith("Error:")


class _TreeObserver:
    """Counts a REPL batch's items into the run's status (for the status panel)."""

    def __init__(self, tree: RunTree):
        self.tree = tree

    def item_started(self, index: int) -> None:
        self.tree.call_started()

    def item_finished(self, index: int, result: Any) -> None:
        self.tree.call_ended(failed=isinstance(result, str) and result.startswith("Error:"))

    def item_failed(self, index: int, error: BaseException) -> None:
        self.tree.call_ended(failed=True)


class _Fields(dict):
    """Format fields for a custom system prompt; unknown {names} stay as written."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"
