"""How a run finishes, in one package: the answer taken from a reply or a block and
refused when it is not one (``answers``), where an answer came from (``origin``), what a
reply wrote before it saw its code's output (``seen_output``), and the instructions' own
words, which are never an answer (``echoes``)."""

from __future__ import annotations

from .answers import Finishing, is_error

__all__ = ["Finishing", "is_error"]
