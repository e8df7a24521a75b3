"""What a run returns: ``RLMResult``, with its trajectory and usage."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .._terminal_text import one_line
from ..errors import RLMRunError
from ..llm.usage import UsageSummary
from . import render


@dataclass
class CodeRun:
    """One code block of an iteration and the output the model saw."""

    code: str
    output: str
    elapsed_s: float = 0.0
    error: bool = False


@dataclass
class Compaction:
    """The root model's conversation was summarised to fit its window, before an
    iteration; the full history went into the REPL variable ``history``."""

    before_iteration: int
    reason: str  # "threshold" (compact_at) or "context error" (the provider refused)
    tokens_before: int  # estimated tokens of the conversation
    tokens_after: int
    input_tokens: int = 0  # what the summary call cost
    output_tokens: int = 0
    cost_usd: float | None = None
    summary: str = ""
    cut_off: bool = False  # the summary stopped at its max_tokens (asked twice)


@dataclass
class Withheld:
    """What a turn wrote before it saw its code's output, and was not taken (see
    ``seen_output``)."""

    what: str  # the answer as written ("FINAL(7)"), or the first line of a guess
    # "unseen output": an answer written after code whose output the model had not seen;
    # "unseen failure": an answer after a block that failed; "guessed output": text that
    # guessed a block's output, left out of the conversation with all that followed.
    why: str


@dataclass
class Iteration:
    """One root-model turn."""

    index: int
    response: str
    code: list[CodeRun] = field(default_factory=list)
    sub_calls: int = 0
    elapsed_s: float = 0.0
    early_blocks: int = 0  # blocks started while the turn was still streaming
    broken_off: str | None = None  # why the turn's text broke off after its code ran
    compaction: Compaction | None = None  # the conversation was compacted before it
    cut_answers: int = 0  # sub-call answers that stopped at max_tokens
    notes: list[str] = field(default_factory=list)  # how the run read the reply
    withheld: list[Withheld] = field(default_factory=list)  # written before output was seen
    finished_by: str = ""  # the turn that ended the run: how (see RLMResult.finished_by)


@dataclass
class RLMResult:
    """The outcome of one RLM run, complete or partial."""

    query: str
    final_answer: str | None = None
    success: bool = False
    iterations: int = 0
    usage: UsageSummary = field(default_factory=UsageSummary)
    trajectory: list[Iteration] = field(default_factory=list)
    error: str | None = None
    elapsed_s: float = 0.0
    # "final", "max_iterations", "budget", "error", "interrupted", or "empty_answer" (an
    # answer that says nothing, given again after the model was told).
    stop_reason: str = ""
    # How the model gave its answer, a ``repl.finishers.FinishKind``'s value: "text
    # marker" (FINAL/FINAL_VAR in its reply), "call in code" (FINAL()/FINAL_VAR() in a
    # block), "printed marker" (a block printed FINAL(...)) or "answer dict"
    # (answer["ready"] = True); "" without an answer.
    finished_by: str = ""
    # Where the answer came from when it was not this question's own work: "the variable
    # 'summary', carried from question 1" (a session's earlier question); "" otherwise.
    answer_origin: str = ""
    model: str = ""
    sub_model: str = ""
    depth: int = 0
    sandbox: str = ""  # where the model's code ran: a backend's name ("process", "wasm", "none")
    # Whether the sandbox had no network (None when the code ran in the kernel).
    network_isolated: bool | None = None
    # Which isolation layers held in the sandbox (user, pid, filesystem, network,
    # syscalls, processes, memory: True or False) and a note for each that did not.
    isolation: dict[str, Any] | None = None
    # The REPL variables the model made, kept whatever ended the run, so sub-call
    # answers already paid for are never lost. In-process: the values themselves; from
    # a sandbox: JSON data, or a SandboxRepr string for anything else.
    variables: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # Where the root conversation was summarised to fit the model's window.
    compactions: list[Compaction] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # the run's notes on the last turn

    @property
    def answer(self) -> str | None:
        return self.final_answer

    @property
    def interrupted(self) -> bool:
        return self.stop_reason == "interrupted"

    def as_exception(self, kept_in: str | None = None) -> RLMRunError:
        """The run's failure as an error; ``kept_in`` names the variable holding this
        result, for the message."""
        return RLMRunError(self, kept_in)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of the result; ``variables`` gives each variable's type."""
        data = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("usage", "trajectory", "variables", "compactions")
        }
        data["compactions"] = [asdict(c) for c in self.compactions]
        data["trajectory"] = [asdict(iteration) for iteration in self.trajectory]
        data["usage"] = self.usage.to_dict()
        data["variables"] = {
            name: getattr(value, "type_name", "") or type(value).__name__
            for name, value in self.variables.items()
        }
        return data

    def save(self, path: str | Path) -> Path:
        """Append this run to a JSONL log: one line per iteration, then a summary line,
        like the official RLM library's logger."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with path.open("a", encoding="utf-8") as log:
            for iteration in self.trajectory:
                log.write(
                    json.dumps(
                        {
                            "type": "iteration",
                            "time": stamp,
                            "query": self.query,
                            **asdict(iteration),
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )
            summary = {k: v for k, v in self.to_dict().items() if k != "trajectory"}
            log.write(
                json.dumps({"type": "result", "time": stamp, **summary}, ensure_ascii=False) + "\n"
            )
        return path

    def __repr__(self) -> str:
        # What terminals show (IPython, jupyter console): one line, its controls visible.
        status = "ok" if self.success else (self.stop_reason or "failed")
        answer = self.final_answer if self.final_answer is not None else self.error
        answer = " ".join(str(answer).split())
        if len(answer) > 200:
            answer = answer[:200] + "..."
        return (
            f"RLMResult({status}, iterations={self.iterations}, "
            f"sub-calls={sum(i.sub_calls for i in self.trajectory)}): {one_line(answer)}"
        )

    def _repr_markdown_(self) -> str:
        return render.result_markdown(self)

    def _repr_html_(self) -> str:
        return render.result_html(self)

    def without_error(self) -> _ShownBeforeItsError:
        """This result's views without the failed run's error: what a cell shows just
        before it raises that error, so the error reads once."""
        return _ShownBeforeItsError(self)


class _ShownBeforeItsError:
    def __init__(self, result: RLMResult):
        self.result = result

    def __repr__(self) -> str:
        if self.result.final_answer is not None:
            return repr(self.result)
        return repr(self.result).split("): ", 1)[0] + ")"  # the error follows

    def _repr_markdown_(self) -> str:
        return render.result_markdown(self.result, with_error=False)

    def _repr_html_(self) -> str:
        return render.result_html(self.result, with_error=False)
