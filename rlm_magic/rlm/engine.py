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
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..config import RLMConfig
from ..errors import ConfigError, LLMQueryError, PromptTooLongError, describe_exception
from ..llm.client import LLMClient
from ..llm.redaction import off_loop_if_large, redact_messages
from ..llm.transports import close_loop_clients
from ..llm.usage import SESSION_LEDGER, UsageLedger
from ..llm.windows import answer_room, chars_per_token, is_context_error
from ..repl.base import SandboxSettings
from ..repl.inprocess import AsyncREPL
from ..repl.sandbox import SandboxREPL
from ..repl.steps import FINISHERS, preloaded, repl_builtins
from .compaction import Conversation
from .live_turn import LiveTurn
from .prompts import (
    CONTINUE_PROMPT,
    ITERATION_LIMIT_PROMPT,
    SYSTEM_PROMPT,
    chunk_advice,
    describe_context,
)
from .replies import ACCEPTED_FORMS, Final, read_final_call, read_printed_final, read_reply
from .result import CodeRun, Iteration, RLMResult
from .session import RLMSession
from .subcalls import RunTree, SubCalls

if TYPE_CHECKING:
    from ..jupyter.helpers import NotebookHelpers

_run_ids = itertools.count(1)


class RLM(RLMConfig):
    """Recursive Language Model runner and the ``RLM`` settings of rlm-magic."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._client: LLMClient | None = None
        self._helpers: NotebookHelpers | None = None
        self.sessions: dict[str, RLMSession] = {}

    @property
    def client(self) -> LLMClient:
        """The client all calls of this RLM go through (one limit, one ledger)."""
        if self._client is None:
            self._client = LLMClient(self, UsageLedger(parent=SESSION_LEDGER))
        return self._client

    @property
    def helpers(self) -> NotebookHelpers:
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

    def start(self, query: str, context: Any = None, **overrides) -> Run:
        """A run, not yet started: ``await run.execute()``; ``run.result`` is kept up
        to date, so a caller still has the partial result after an interrupt."""
        return Run(self, query, context, **overrides)

    async def arun(
        self,
        query: str,
        context: Any = None,
        *,
        model: str | None = None,
        sub_model: str | None = None,
        max_iterations: int | None = None,
        max_depth: int | None = None,
        namespace: dict[str, Any] | None = None,
        sandbox: str | None = None,
        session: RLMSession | str | None = None,
    ) -> RLMResult:
        """Answer ``query`` about ``context``; returns an ``RLMResult`` (check ``.success``).

        ``session``: an ``RLMSession`` (or the name of one of this RLM's) to carry on
        in: its REPL variables, contexts and earlier answers are there for this question.

        ``namespace``: run the REPL in this dict instead of a fresh one (what ``--live``
        does with the notebook's namespace); such a run is never sandboxed.
        ``sandbox``: "process" or "none" for this run (default: ``RLM.sandbox``).
        """
        return await self.start(
            query,
            context,
            model=model,
            sub_model=sub_model,
            max_iterations=max_iterations,
            max_depth=max_depth,
            namespace=namespace,
            sandbox=sandbox,
            session=session,
        ).execute()

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
                    "session=...)`, e.g. inside one asyncio.run for all the questions"
                ) from None
            return asyncio.run(self._run_and_close(query, context, **overrides))
        raise RuntimeError(
            "RLM.run() cannot be used inside a running event loop (such as "
            "a notebook cell): use `await rlm.arun(...)` instead"
        )


class Run:
    """One RLM run (root or child): its REPL, messages and result."""

    def __init__(
        self,
        rlm: RLM,
        query: str,
        context: Any = None,
        *,
        model: str | None = None,
        sub_model: str | None = None,
        max_iterations: int | None = None,
        max_depth: int | None = None,
        namespace: dict[str, Any] | None = None,
        sandbox: str | None = None,
        depth: int = 0,
        tree: RunTree | None = None,
        deadline: float | None = None,
        session: RLMSession | str | None = None,
    ):
        self.rlm = rlm
        if isinstance(session, str):
            session = rlm.session(session, sandbox)
        if session is not None and namespace is not None:
            raise ConfigError(
                "a session keeps a REPL of its own: it cannot run in the "
                "notebook's namespace (--live)"
            )
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
        self.tree = tree or RunTree(
            UsageLedger(parent=rlm.client.ledger), rlm.max_sub_calls, rlm.max_cost_usd
        )
        self.namespace = namespace
        self.sandbox = "none" if namespace is not None else (sandbox or rlm.sandbox)
        if session is not None:
            if sandbox is not None and sandbox != session.sandbox:
                where = "in a sandbox process" if session.sandbox == "process" else "in this kernel"
                raise ConfigError(
                    f"session {session.name!r} runs its code {where}; it "
                    f"cannot switch to sandbox={sandbox!r}"
                )
            self.sandbox = session.sandbox  # the REPL it keeps
        if self.sandbox not in ("process", "none"):
            raise ValueError(f"sandbox must be 'process' or 'none', got {self.sandbox!r}")
        # What the REPL's helpers call: pinned sub-model, budgets, errors as values.
        self.calls = SubCalls(
            rlm,
            self.tree,
            sub_model=self.sub_model,
            depth=depth,
            max_depth=self.max_depth,
            max_tokens=self.max_tokens,
            child_run=self._child_run,
            deadline=deadline,
        )
        # (answer, how) once a block finished the run: FINAL called or printed in code,
        # or the answer dict set ready.
        self._finished: tuple[str, str] | None = None
        self._told_restored: set[str] = set()  # scaffold names the model was told of
        self._cut_off = ""  # where the last root turn was cut ("" if it was whole)
        self._broken_off: str | None = None  # why the last root turn broke off
        self.early_execution = rlm.early_execution and rlm.stream
        self.result = RLMResult(
            query=query,
            model=self.model,
            sub_model=self.sub_model,
            depth=depth,
            sandbox=self.sandbox,
        )
        # The root conversation, compacted to fit the model's window.
        self.conversation = Conversation(
            rlm.client,
            model=self.model,
            max_tokens=self.max_tokens,
            compact_at=rlm.compact_at,
            ledger=self.tree.ledger,
            deadline=deadline,
            share_history=self._share_history,
            status=self._status,
            compactions=self.result.compactions,
        )

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
        namespace = (
            self.namespace if live else {"__name__": "__rlm__", "__builtins__": repl_builtins()}
        )
        saved, touched = {}, []
        preexisting = set(namespace) if live else set()  # the notebook's own variables
        try:
            injected = self._repl_globals(namespace)
            touched = [
                *injected,
                *self.calls.helpers(),
                *FINISHERS,
                "__rlm_async__",
                "__rlm_print_final__",
                "history",
            ]
            if live:
                saved = {name: namespace[name] for name in touched if name in namespace}
            if self.session is not None:
                await self._session_repl(self.session, namespace, injected)
            elif self.sandbox == "process":
                self.repl = SandboxREPL(
                    self.context,
                    self.calls.helpers(),
                    max_output_chars=self.max_output_chars,
                    secrets=tuple(self.rlm.configured_secrets()),
                    settings=SandboxSettings.from_config(self.rlm),
                    sub_calls_left=self.tree.sub_calls_left,
                )
                await self.repl.start()  # the process starts while the root model thinks
            else:
                namespace.update(injected)
                self.repl = AsyncREPL(namespace, self.calls.helpers())
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
                result.error = (
                    "the final answer is an error message, not an answer: "
                    + " ".join(result.final_answer.split())[:300]
                )
            result.success = result.stop_reason == "final"
            result.iterations = len(result.trajectory)
            result.usage = self.tree.ledger.summary()
            result.elapsed_s = time.perf_counter() - started
        return result

    async def _session_repl(
        self, session: RLMSession, namespace: dict[str, Any], injected: dict[str, Any]
    ) -> None:
        """The session's REPL, made by its first run and kept: a new context joins the
        earlier ones as context_N and becomes `context`."""
        fresh = self.context is not None
        context = self.context if fresh else session.context
        names = [f"context_{len(session.contexts)}", "context"] if fresh else []
        helpers = self.calls.helpers()
        if session.repl is None:
            if self.sandbox == "process":
                # The session owns it from the start: whatever happens next, it is closed.
                self.repl = session.repl = SandboxREPL(
                    context,
                    helpers,
                    max_output_chars=self.max_output_chars,
                    secrets=tuple(self.rlm.configured_secrets()),
                    context_names=names[:1],
                    settings=SandboxSettings.from_config(self.rlm),
                    sub_calls_left=self.tree.sub_calls_left,
                )
                try:
                    await self.repl.start()
                except BaseException:
                    session.repl = None  # the run's end closes it; the next run starts anew
                    raise
            else:
                namespace.update(injected)
                namespace.update(dict.fromkeys(names, context))
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
            result.variables = {
                name: value for name, value in variables.items() if name not in preexisting
            }
        finally:
            if self.session is None or self.session.repl is not self.repl:
                await self.repl.aclose()  # stopped steps may send nothing more

    async def _loop(self, result: RLMResult) -> None:
        # litellm's model info gives the windows the prompt advises by.
        await self.client.look_up_windows(self.model, self.sub_model)
        self.conversation.start(self._system_prompt(), self._first_message())
        for index in range(1, self.max_iterations + 1):
            self._status("thinking", iteration=index)
            turn_started = time.perf_counter()
            calls_before = self.calls.own
            iteration, outputs = Iteration(index=index, response=""), []

            def new_turn(iteration=iteration, outputs=outputs):
                return LiveTurn(
                    (lambda n, code: self._run_block(n, code, iteration, outputs))
                    if self.early_execution
                    else None
                )

            reply, turn = await self._root_turn(index, iteration, new_turn)
            iteration.response = reply
            result.trajectory.append(iteration)
            feedback, final = await self._act_on(reply, iteration, turn, outputs)
            if iteration.broken_off:
                ran = " after its code had run" if iteration.early_blocks else ""
                feedback = (
                    f"(Your reply was cut off{ran}: {iteration.broken_off}. Its "
                    f"output is below.)\n\n{feedback}"
                )
            iteration.sub_calls = self.calls.own - calls_before
            iteration.elapsed_s = time.perf_counter() - turn_started
            if final is not None:
                result.final_answer, result.finished_by = final
                iteration.finished_by, result.stop_reason = result.finished_by, "final"
                return
            if self._stopped_by_budget(result):
                return
            self.conversation.add(reply, feedback)

        # Out of iterations: one last chance to answer, without running code.
        self._status("thinking", iteration=self.max_iterations)
        reply, _ = await self._root_turn(
            self.max_iterations + 1,
            None,
            LiveTurn,
            extra=[{"role": "user", "content": ITERATION_LIMIT_PROMPT}],
        )
        reading = read_reply(reply)
        if self._broken_off:  # a block it left unclosed may be half written
            reading = replace(reading, fences=[f for f in reading.fences if f.closed])
            self._broken_off = None
        # Code is not run now; a block that only calls FINAL (as the prompt teaches)
        # is read as the answer it gives.
        marker = self._readable(reading)[0] or next(
            filter(None, map(read_final_call, reading.blocks)), None
        )
        answer = (await self._resolve_final(marker))[0] if marker else None
        if answer is not None:
            result.final_answer, result.stop_reason = answer, "final"
            result.finished_by = "text marker"
        else:
            result.final_answer = reply.strip() or None
            result.stop_reason = "max_iterations"
            result.error = (
                f"no FINAL answer within max_iterations={self.max_iterations}; "
                "final_answer holds the model's last reply"
            )

    # -- a conversation that fits the root model's window ------------------------------
    async def _root_turn(
        self, index: int, iteration: Iteration | None, new_turn, extra: list[dict] = ()
    ) -> tuple[str, LiveTurn]:
        """A root turn on the conversation, compacted first when it nears the model's
        window; a context-length error compacts it once more and tries again."""
        conversation = self.conversation
        self._refresh_advice()
        record = await conversation.compact_if_near_window(index)
        if record is not None and iteration is not None:
            iteration.compaction = record
        turn = new_turn()
        try:
            return await self._ask_root(conversation.messages + list(extra), turn, iteration), turn
        except LLMQueryError as exc:
            if not is_context_error(exc) or turn.ran:
                raise
        record = await conversation.compact(index, "context error")
        if iteration is not None:
            iteration.compaction = record
        turn = new_turn()
        try:
            return await self._ask_root(conversation.messages + list(extra), turn, iteration), turn
        except PromptTooLongError as exc:
            # Not a sub-call's "split it": the conversation was just compacted, and
            # what is left (system prompt, question, summary) is still too long.
            raise LLMQueryError(
                self.model,
                (
                    f"the root conversation is about {exc.tokens:,} tokens even after "
                    f"compaction, and the root model takes {exc.room:,}: use a root model "
                    "with a larger window (RLM.model), or a shorter question"
                ),
            ) from None

    async def _share_history(self, history: list[dict]) -> None:
        """The whole conversation as the REPL variable ``history``, redacted as all that
        the model's code can see is (the sandbox's code must not read a secret either)."""
        shared = await redact_messages([dict(m) for m in history], self.client.redactor())
        await self.repl.set_variable("history", shared)

    async def _ask_root(
        self, messages, turn: LiveTurn | None = None, iteration: Iteration | None = None
    ) -> str:
        """One root turn, streamed into ``turn`` (the panel shows it; with early
        execution its finished blocks start running). If the turn fails after some of
        its blocks ran, it is not asked again (its code would run twice): the partial
        turn stands, with its outputs, and the model is told where it was cut off."""
        turn = turn if turn is not None else LiveTurn()
        if self.depth == 0:
            self.tree.live_turn = turn
        try:
            completion = await self.client.complete(
                messages,
                model=self.model,
                max_tokens=self.max_tokens,
                ledger=self.tree.ledger,
                stream=True,
                on_text=turn,
                cache_prefix=True,
                deadline=self.calls.outer_deadline,
                may_retry=lambda: not turn.ran,
            )
        except BaseException as exc:
            if turn.ran and iteration is not None and isinstance(exc, Exception):
                # Cut off after its code ran: the partial turn stands, and _act_on lets
                # its blocks finish.
                iteration.broken_off = describe_exception(exc)
                iteration.early_blocks = turn.ran
                self._cut_off = "before its end"  # its text ends where it broke off
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
        # Stopped at max_tokens or broken off: either way its FINAL may be cut short.
        self._cut_off = (
            ""
            if not getattr(completion, "incomplete", False)
            else "at max_tokens"
            if completion.cut_off
            else "before its end"
        )
        # A turn that broke off (a stall, a server gone) is kept as far as it came; a
        # block it left unclosed is not run (it may be half written).
        self._broken_off = getattr(completion, "cut_reason", None)
        if self._broken_off and iteration is not None:
            iteration.broken_off = self._broken_off
        return completion.text

    async def _act_on(
        self,
        reply: str,
        iteration: Iteration,
        turn: LiveTurn | None = None,
        outputs: list[str] | None = None,
    ) -> tuple[str, tuple[str, str] | None]:
        """Run the reply's code; return (feedback for the model, (final answer, how it
        was given) or None)."""
        reading = read_reply(reply)
        if self._broken_off:
            reading = replace(reading, fences=[f for f in reading.fences if f.closed])
            self._broken_off = None
        blocks = reading.blocks
        outputs = outputs if outputs is not None else []
        if turn is not None and self.early_execution:
            await turn.finish(blocks)  # the blocks not started while streaming, in order
            if turn.stopped:
                return "", self._finished
        else:
            for number, code in enumerate(blocks, 1):
                if await self._run_block(number, code, iteration, outputs):
                    return "", self._finished
        marker, problems = self._readable(reading)
        if marker is not None:
            answer, problem = await self._resolve_final(marker, iteration)
            if answer is not None:
                return "", (answer, "text marker")
            problems = [problem]
        outputs += problems
        if not blocks and marker is None and not problems:
            outputs.append(
                f"You wrote no ```repl code and gave no final answer. To finish: {ACCEPTED_FORMS}."
            )
        return "\n\n".join(outputs + [CONTINUE_PROMPT]), None

    def _readable(self, reading) -> tuple[Final | None, list[str]]:
        """The reply's final answer and the problems to tell the model. An answer read
        by the line rule (no ')' balances it) from a reply cut off (at max_tokens, or
        broken off by a stall or the step's deadline) may be cut off itself: it is not
        taken."""
        final = reading.final
        if final is not None and self._cut_off and not final.balanced:
            return None, [
                f"Your reply was cut off {self._cut_off} inside "
                f"{final.kind}(...), so its answer may be cut off too; it was "
                "not taken. Give the "
                f"answer again, shorter. Accepted forms: {ACCEPTED_FORMS}."
            ]
        return final, reading.problems

    async def _run_block(
        self, number: int, code: str, iteration: Iteration, outputs: list[str]
    ) -> bool:
        """Run one block; True when the model's code set the answer ready."""
        self._status("running code")
        # Sub-calls of this step must end in time for the step to end with their
        # results and errors in hand: they get a deadline a little before the step's.
        timeout = self.step_timeout
        outer = self.calls.outer_deadline
        if outer is not None:
            # A child run: its step must be stopped, and unwound, before the parent's
            # step ends (a stopped step's thread gets up to half a second to unwind).
            timeout = max(0.1, min(timeout, outer - time.monotonic() - 0.5))
        # A tenth of the step, at least half a second (less only for very short steps:
        # a quarter of them), at most two.
        margin = min(2.0, max(0.1 * timeout, min(0.5, timeout / 4)))
        self.calls.step_deadline = time.monotonic() + timeout - margin
        cut_before = self.calls.cut_answers
        try:
            step = await self.repl.run(code, timeout=timeout)
        except BaseException:
            # Interrupted mid-step: keep what the step printed in the trajectory.
            partial = self.repl.last_output
            shown = self.client.redactor().head(partial.as_text(), self.max_output_chars)
            iteration.code.append(CodeRun(code, shown, partial.elapsed_s, error=True))
            raise
        finally:
            self.calls.step_deadline = None
            if self.tree.live_turn is not None and self.depth == 0:
                self._status("thinking")  # an early block ended; the model still writes
        seen = await self._as_model_sees_it(step.as_text(), step.dropped_chars)
        cut = self.calls.cut_answers - cut_before
        if cut:
            iteration.cut_answers += cut
            seen += (
                f"\n[{cut} sub-call answer{'s' if cut > 1 else ''} of this step "
                f"{'are' if cut > 1 else 'is'} cut off (stopped at max_tokens, or "
                "broken off); ask for shorter answers or smaller pieces]"
            )
        seen += self._restored_note(step.restored)
        finish = step.finish
        if finish and step.error is not None:
            # An answer given before the block failed or was stopped is not taken: the
            # failure may be the check that should have kept it from being the answer.
            called = "answer['ready'] was set" if finish[0] == "answer dict" else "FINAL was called"
            failure = step.error.strip().splitlines()[-1]
            seen += f"\n[{called}, but the block then failed: {failure}; the run goes on]"
            finish = None
        iteration.code.append(CodeRun(code, seen, step.elapsed_s, error=step.error is not None))
        outputs.append(f"Output of block {number}:\n{seen}")
        return await self._finished_by_block(finish, outputs, iteration)

    async def _finished_by_block(self, finish, outputs: list[str], iteration: Iteration) -> bool:
        """Whether the block finished the run (the REPL, in this process or the
        sandbox's, says how); the answer goes to ``self._finished``."""
        if not finish:
            return False
        how, answer = finish
        if how == "print":  # the block printed a FINAL(...) line of its own
            marker = read_printed_final(answer)
            if marker is None:
                outputs.append(
                    f"Your code printed {answer.strip()[:200]!r}, from which no "
                    "FINAL(...) answer could be read, so the run goes on. "
                    f"Accepted forms: {ACCEPTED_FORMS}."
                )
                return False
            answer, problem = await self._resolve_final(marker, iteration)
            if answer is None:
                outputs.append(problem)
                return False
            how = "printed marker"
        self._finished = (answer, "call in code" if how == "code" else how)
        return True

    def _restored_note(self, names: list[str]) -> str:
        """Tell the model, once per name, that the block rebound a name the REPL
        provides, and that it is back."""
        new = [name for name in names if name not in self._told_restored]
        self._told_restored.update(new)
        if not new:
            return ""
        listed = ", ".join(f"`{name}`" for name in new)
        return (
            f"\n[Your code rebound {listed}, which the REPL provides; "
            f"{'it is' if len(new) == 1 else 'they are'} restored for your next "
            "blocks. Keep your own values under other names.]"
        )

    async def _resolve_final(
        self, marker, iteration: Iteration | None = None
    ) -> tuple[str | None, str]:
        answer, problem = await self._resolve_marker(marker, iteration)
        if answer is not None and not answer.strip():  # an empty variable's value
            return None, (
                f"{marker.kind}({marker.value}) gives an empty answer, so the "
                "run goes on. Give the answer itself."
            )
        return answer, problem

    async def _resolve_marker(
        self, marker, iteration: Iteration | None = None
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
                    note = (
                        f"FINAL({marker.value}) names a REPL variable: answered with "
                        "its value, as FINAL_VAR would"
                    )
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
        return None, (
            f"FINAL_VAR({marker.value}): there is no variable named "
            f"{marker.value!r} in the REPL (variables: {names})."
        )

    def _stopped_by_budget(self, result: RLMResult) -> bool:
        self._warn_if_budget_is_blind()
        if not self.tree.over_budget():
            return False
        result.stop_reason = "budget"
        result.error = (
            f"cost budget exceeded: spent ${self.tree.ledger.cost_usd:.4f} of "
            f"max_cost_usd=${self.tree.max_cost_usd:g}"
        )
        return True

    def _warn_if_budget_is_blind(self) -> None:
        tree = self.tree
        if tree.max_cost_usd is None or tree.warned_unpriced:
            return
        unpriced = [
            row.model for row in tree.ledger.summary().by_model.values() if row.unpriced_calls
        ]
        if unpriced:
            tree.warned_unpriced = True
            import warnings

            warnings.warn(
                f"max_cost_usd is set, but litellm has no price for "
                f"{', '.join(unpriced)}: those calls count as $0 against the "
                "budget",
                RuntimeWarning,
                stacklevel=2,
            )

    async def _as_model_sees_it(self, text: str, dropped: int = 0) -> str:
        """Step output as the model sees it: secrets removed, cut to max_output_chars
        with a note. ``dropped``: characters the sandbox already left out."""
        limit = self.max_output_chars
        redact = self.client.redactor()
        if len(text) <= limit:
            return await off_loop_if_large(len(text), redact, text)
        head = await off_loop_if_large(limit, redact.head, text, limit)
        return (
            head + f"\n... [output cut: {len(text) + dropped - limit:,} more characters not "
            "shown; print smaller slices]"
        )

    # -- prompts ----------------------------------------------------------------------
    def _chunk_advice(self) -> tuple[str, str]:
        """What one sub-call prompt can hold: the sub-model's window less its answers'
        room, at the characters per token its usage reports showed."""
        window = self.client.input_window(self.sub_model, advice=True)
        return chunk_advice(
            window - answer_room(window, self.max_tokens, self.sub_model) if window else None,
            chars_per_token(self.sub_model),
        )

    def _refresh_advice(self) -> None:
        """A window learned since the system prompt was written (or a tokenizer that
        reads a quarter more or less than it assumed) changes the chunk advice: the
        system prompt is written again. Only then: a new system prompt costs the
        provider's prompt cache its prefix."""
        window, per_token = self._advised_for
        now = (
            self.client.input_window(self.sub_model, advice=True),
            chars_per_token(self.sub_model),
        )
        if now[0] == window and abs(now[1] - per_token) <= 0.25 * per_token:
            return
        if self.conversation.messages:
            self.conversation.messages[0] = {"role": "system", "content": self._system_prompt()}

    def _system_prompt(self) -> str:
        if getattr(self, "_described", None) is None:
            self._described = describe_context(self.context)
        type_name, length, preview = self._described
        self._advised_for = (
            self.client.input_window(self.sub_model, advice=True),
            chars_per_token(self.sub_model),
        )
        reads, chunk = self._chunk_advice()
        fields = _Fields(
            context_type=type_name,
            context_length=length,
            sub_model_reads=reads,
            chunk_size=chunk,
            context_preview=self.client.redactor()(preview),
            max_depth=self.max_depth,
            depth_left=self.max_depth - self.depth,
            max_output_chars=self.max_output_chars,
        )
        template = self.rlm.system_prompt or SYSTEM_PROMPT
        try:
            return template.format_map(fields)
        except (ValueError, IndexError):
            return template  # a custom prompt with literal braces: use it as written

    def _first_message(self) -> str:
        question = (
            f"Question: {self.query}\n\nThe data is in the REPL variable `context`. "
            "Look at it before you answer."
        )
        session = self.session
        if session is None or not session.exchanges:
            return question
        contexts = len(session.contexts)
        earlier = (
            f" Earlier contexts of this session: "
            f"{', '.join(f'context_{i}' for i in range(contexts - 1))}."
            if contexts > 1
            else ""
        )
        return f"{session.memory()}\n\n{question}{earlier}"

    # -- the REPL's view --------------------------------------------------------------
    def _repl_globals(self, namespace: dict[str, Any]) -> dict[str, Any]:
        return preloaded(namespace, self.context)

    async def _child_run(self, prompt: str, context: Any, deadline: float | None) -> RLMResult:
        """A child RLM for ``rlm_query``: the sub-model as its root, this run's tree."""
        child = Run(
            self.rlm,
            prompt,
            context,
            model=self.sub_model,
            sub_model=self.sub_model,
            max_iterations=self.max_iterations,
            max_depth=self.max_depth,
            sandbox=self.sandbox,
            depth=self.depth + 1,
            tree=self.tree,
            deadline=deadline,
        )
        return await child.execute()

    def _status(self, phase: str, iteration: int | None = None) -> None:
        if self.depth == 0:
            self.tree.phase = phase
            if iteration is not None:
                self.tree.iteration = iteration
                self.tree.max_iterations = self.max_iterations


def _is_error(answer: str | None) -> bool:
    """An answer that is a failed call's error string, or only such strings (a
    FINAL_VAR of a list whose every item is an ``Error:``)."""
    if not isinstance(answer, str):
        return False
    text = answer.strip()
    if text.startswith("Error:"):
        return True
    if text[:1] in "[(" and text[-1:] in "])" and len(text) < 1_000_000:
        import ast

        try:
            items = ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return False
        return (
            isinstance(items, (list, tuple))
            and bool(items)
            and all(isinstance(item, str) and item.lstrip().startswith("Error:") for item in items)
        )
    return False


class _Fields(dict):
    """Format fields for a custom system prompt; unknown {names} stay as written."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"
