"""How a scripted root model writes a code block, what the local server was sent, and what
the blocks of a run printed."""

from __future__ import annotations


def repl(code: str, text: str = "") -> str:
    """A root model's reply: ``text``, then ``code`` in a repl block."""
    return f"{text}\n```repl\n{code}\n```\n"


def sub_requests(server):
    return server.requests_for("sub-model")


def root_requests(server):
    return server.requests_for("root-model")


def last_feedback(server) -> str:
    """The last message the root model was sent (the REPL output it saw)."""
    return root_requests(server)[-1]["messages"][-1]["content"]


def outputs(result) -> list[str]:
    """What each code block of a run printed, in order."""
    return [run.output for iteration in result.trajectory for run in iteration.code]
