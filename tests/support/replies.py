"""How a scripted root model writes a code block, and what the local server was sent."""

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
