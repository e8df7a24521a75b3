"""What a model sends is read in time linear in its size, continued (issue 38): the
code-fence reader, a streamed turn watched for its blocks, and a reply full of markers.
Each reader is timed on this thread's CPU clock against a bound far above what it takes,
so that one gone quadratic fails at once; the fast readers read as the ones they replaced."""

from __future__ import annotations

import re
import time

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlm_magic.rlm import replies

LARGE = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SMALL = settings(max_examples=500, deadline=None)


def cpu_seconds(read, *args):
    """What ``read(*args)`` returns, and the CPU time it took this thread."""
    started = time.thread_time()
    outcome = read(*args)
    return outcome, time.thread_time() - started


# -- the opening fence of a code block --------------------------------------------------
# The pattern it replaced, kept as the specification of what opens a fence.
PLAIN_OPENING = re.compile(r"^([ \t]*)(`{3,})[ \t]*([^\s`]*)[^`\n]*$")

fence_lines = st.text(alphabet=" \t`~ab1\u00a0\r\x0b-_.{}", max_size=40)


@SMALL
@given(line=fence_lines)
@example("```repl")
@example("  ````python title`")
@example("``` \t py x")
@example("```\u00a0lang")
def test_a_fence_opens_on_the_lines_it_opened_on_before(line):
    plain, fast = PLAIN_OPENING.match(line), replies._OPENING.match(line)
    assert (plain is None) == (fast is None)
    if plain is not None and fast is not None:
        assert plain.group(1, 2, 3) == fast.group(1, 2, 3)


@LARGE
@given(
    word=st.text(alphabet="ab1-_.", min_size=1, max_size=5),
    size=st.integers(min_value=1_000, max_value=100_000),
    end=st.sampled_from(["`", " `", "x`", "", " "]),
)
def test_a_long_fence_line_is_read_in_linear_time(word, size, end):
    line = "```" + word * (size // len(word)) + end
    _, seconds = cpu_seconds(replies._OPENING.match, line)
    assert seconds < 0.05 + 1e-6 * size, (word, size, end)  # was 3 s at 20,000


# -- a typed answer's strings, redacted ---------------------------------------------------
SECRET = "sk-proj-Typed0123456789abcdefGHIJKLmnopQRSTuvwx"


async def test_a_typed_answer_of_thousands_of_objects_is_redacted_in_one_pass():
    from rlm_magic.llm.redaction import Redactor
    from rlm_magic.rlm.subcalls import redacted

    answer = {
        "items": [{"name": f"item {i}", "note": "a plain note", "n": i} for i in range(20_000)]
    }
    started = time.process_time()  # (its work is done in a thread)
    clean = await redacted(answer, Redactor(extra=[SECRET]))
    seconds = time.process_time() - started
    assert seconds < 0.25  # string by string: 0.8 s here; now 0.04 s
    assert clean is answer  # (nothing found: not copied)


async def test_a_typed_answer_loses_the_secret_in_its_keys_values_and_cut_texts():
    from rlm_magic.llm.completion import CutAnswer
    from rlm_magic.llm.redaction import Redactor
    from rlm_magic.rlm.subcalls import redacted

    answer = {
        "items": [{"name": "one", "n": 1}, None, True, 2.5],
        f"echo {SECRET}": [SECRET[:20], SECRET[20:]],
        "cut": CutAnswer(f"said {SECRET}", "it stopped at max_tokens", broken_off=False),
    }
    clean = await redacted(answer, Redactor(extra=[SECRET]))
    assert clean["items"] == answer["items"]
    assert clean["echo [REDACTED]"] == ["[REDACTED]", "[REDACTED]"]  # (split in two, too)
    assert isinstance(clean["cut"], CutAnswer) and clean["cut"].text == "said [REDACTED]"
    assert clean["cut"].reason == "it stopped at max_tokens"
