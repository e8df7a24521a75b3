"""What a hostile model writes: terminal controls in its answer, its streamed turn, its
code's output and its errors, each with the raw sequence that gives it away in what a
terminal or a notebook client receives. Shared by the specifications of what is shown
(cleaned text, terminals, kernels, magics)."""

from __future__ import annotations

# What a hostile model writes, each piece with the raw sequence that gives it away in
# what a terminal receives (the capture holds the terminal's own sequences too: prompts,
# colours, cursor moves of its own, so each piece is one no terminal program writes).
ATTACKS = {
    "OSC 52 (writes the clipboard)": ("\x1b]52;c;UFdORUQ=\x07", "\x1b]52;"),
    "OSC 8 (a disguised link)": (
        "\x1b]8;;https://evil.example/\x1b\\docs\x1b]8;;\x1b\\",
        "\x1b]8;",
    ),
    "CSI 2J (clears the screen)": ("\x1b[2J", "\x1b[2J"),
    "cursor up 42 lines": ("\x1b[42A", "\x1b[42A"),
    "cursor to row 13, column 37": ("\x1b[13;37H", "\x1b[13;37H"),
    "8-bit CSI (a C1 control)": ("\x9b2J", "\x9b"),
    "backspaces over text": ("FAKE\x08\x08\x08\x08REAL", "FAKE\x08"),
    "a lone carriage return": ("FAKE\rREAL", "FAKE\r"),
    "bidi override": ("\u202eevil\u202c", "\u202e"),
    "bidi isolate": ("\u2066x\u2069", "\u2066"),
}
HOSTILE = " ".join(text for text, _ in ATTACKS.values())


def raw_sequences(received: str) -> dict[str, int]:
    """How many times each attack's raw sequence is in ``received`` (only those found)."""
    counts = {name: received.count(raw) for name, (_, raw) in ATTACKS.items()}
    return {name: count for name, count in counts.items() if count}


def _block(code: str) -> str:
    return f"```repl\n{code}\n```\n"


# The root model's turns of a hostile run: prose with raw controls, streamed (what the
# status line shows), then code whose printed output is the hostile text, then its
# answer: that output, FINAL_VAR'd. And a run that fails with it in its error.
STREAMED = "Reading: \x1b[2J\x1b[42A \x1b]52;c;UFdORUQ=\x07 \u202eevil\u202c \x9b2J done"
HOSTILE_RUN = [
    f"{STREAMED}\n" + _block(f"out = {HOSTILE!r}\nprint(out)"),
    "FINAL_VAR(out)",
]
FAILING_RUN = [_block(f"out = 'Error: ' + {HOSTILE!r}"), "FINAL_VAR(out)"]
