"""What model code or a model sends is read in time linear in its size (issue 38).

Size-and-time properties over generated payloads: printed and prose FINAL markers, typed
answers against schemas from model code, the bridge's frames and the answers ``is_error``
reads. Each reader is timed on this thread's CPU clock (other processes on the machine do
not count), against a bound stated here and far above what
``benchmarks/bench_model_sent.py`` measures, so that a reader gone quadratic fails at once.
The fast readers are also checked to read exactly as the plain ones they replaced.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import tracemalloc

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlm_magic.errors import ConfigError, InvalidAnswer
from rlm_magic.llm import structured
from rlm_magic.repl import bridge
from rlm_magic.rlm import replies
from rlm_magic.rlm.finishing import is_error

# A reader may take this much of a thread's CPU per MB, plus a fixed part (a walk that
# stops at its cap). Measured: 5-30 ms per MB, 40 ms for a capped walk.
SECONDS_PER_MB = 0.15
FIXED_SECONDS = 0.2
LARGE = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SMALL = settings(max_examples=300, deadline=None)


def cpu_seconds(read, *args):
    """What ``read(*args)`` returns (or raises), and the CPU time it took this thread."""
    started = time.thread_time()
    try:
        outcome = read(*args)
    except Exception as error:  # noqa: BLE001 - the outcome, whichever it is
        outcome = error
    return outcome, time.thread_time() - started


def within_linear_bound(seconds: float, size: int) -> bool:
    return seconds <= FIXED_SECONDS + SECONDS_PER_MB * size / 2**20


# What the marker reader acts on: parentheses, quotes, emoticon eyes, list markers,
# percentages, line breaks (of every kind ``str.splitlines`` knows), Markdown.
MARKER_ALPHABET = '()"`:;=-% \t\n\x0b\x1c\u2028ax1iIv*_.,>#'
units = st.text(alphabet=MARKER_ALPHABET, min_size=1, max_size=8)
megabytes = st.integers(min_value=100_000, max_value=3_400_000)


# -- printed and prose FINAL markers --------------------------------------------------------
@LARGE
@given(unit=units, size=megabytes, kind=st.sampled_from(["FINAL(", "FINAL_VAR(", " FINAL("]))
def test_a_printed_marker_of_any_shape_is_read_in_time_linear_in_its_size(unit, size, kind):
    printed = kind + unit * (size // len(unit))
    _, seconds = cpu_seconds(replies.read_printed_final, printed)
    assert within_linear_bound(seconds, len(printed)), (unit, size, seconds)


# A reply is read line by line, and each of its markers in full: up to 1.7 s per MB
# (a MB of "FINAL(" lines); a root reply is at most max_tokens long.
REPLY_SECONDS_PER_MB = 3.0


@LARGE
@given(unit=units, size=st.integers(min_value=10_000, max_value=256_000))
def test_a_reply_of_any_shape_is_read_in_time_linear_in_its_size(unit, size):
    # Markers begin lines here and there, so each is read up to the next.
    reply = "FINAL(" + (unit * (size // len(unit))).replace("\n", "\nFINAL(", 50)
    _, seconds = cpu_seconds(replies.read_reply, reply)
    assert seconds <= FIXED_SECONDS + REPLY_SECONDS_PER_MB * len(reply) / 2**20, (unit, size)


def test_the_3_4_mb_printed_marker_of_the_issue_costs_no_memory_and_no_time():
    printed = "FINAL(" + "a) " * 1_133_000
    tracemalloc.start()
    try:
        final, seconds = cpu_seconds(replies.read_printed_final, printed)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert final is None  # more list markers than it reads: no answer, and a problem said
    assert seconds < 0.5  # was 3.7 s (without tracemalloc's slowing)
    assert peak < 2 * len(printed) + 2**20  # the argument's text once; was +133 MB


def test_an_answer_too_long_to_find_the_end_of_says_so():
    final, problems = replies._read_final("FINAL(" + "a) " * 20_000, [])
    assert final is None
    assert problems == [
        "Your FINAL(...) holds more than 10,000 parentheses and quotes, too many to read "
        "where it ends, so no answer was read from it. Put the answer in a variable in a "
        '```repl block and finish with FINAL_VAR("variable_name").'
    ]


def test_an_answer_that_ends_early_is_read_whatever_follows_it():
    printed = "FINAL(forty-two) and then " + "(x) " * 1_000_000
    final, seconds = cpu_seconds(replies.read_printed_final, printed)
    assert final == replies.Final("FINAL", "forty-two")
    assert seconds < 0.05  # it stops at the answer's ')'


@pytest.mark.parametrize("prefix", ["*" * 40, "> " * 2_000, "-*" * 40, "# " + "_" * 60])
def test_a_line_of_markdown_before_no_marker_is_read_at_once(prefix):
    # "(?:[>*]+[ \t]*)*" backtracked exponentially: 30 '*' took minutes.
    _, seconds = cpu_seconds(replies.read_reply, prefix + "x\nFINAL(yes)")
    assert seconds < 0.05
    assert replies.read_reply(prefix + " FINAL(yes)").final == replies.Final("FINAL", "yes")


# The readers they replaced, kept here as the specification of what they read.
def plain_closers(area):
    depth, index = 0, 0
    while index < len(area):
        char = area[index]
        if char in '"`':
            close = area.find(char, index + 1)
            if close != -1 and area.find("\n", index + 1, close) == -1:
                index = close + 1
                continue
        elif plain_is_emoticon(area, index):
            pass
        elif char == "(":
            depth += 1
        elif char == ")":
            if depth:
                depth -= 1
            else:
                yield index, replies._marker_token(area, index)
        index += 1


def plain_is_emoticon(area, index):
    char = area[index]
    if char not in "()" or not re.search(r"[:;=]-?$", area[max(0, index - 2) : index]):
        return False
    return char == ")" or area[index + 1 : index + 2] in ("", " ", "\t", "\n")


def plain_first_line_ending_in_paren(area):
    offset = 0
    for line in area.splitlines(keepends=True):
        stripped = line.rstrip()
        if stripped.endswith(")"):
            return offset + len(stripped) - 1
        offset += len(line)
    return None


def plain_quote(text, limit=160):
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[:limit] + "...")


PLAIN_MARKER = re.compile(r"^[ \t]*(?:[>*_#+`-]+[ \t]*)*(FINAL_VAR|FINAL)\(", re.MULTILINE)
small_texts = st.text(alphabet=MARKER_ALPHABET + "\r\x85\u2029\xa0FINAL", max_size=120)


@SMALL
@given(area=small_texts)
def test_the_fast_reader_finds_the_same_closing_parentheses(area):
    assert list(replies._closers(area)) == list(plain_closers(area))


@SMALL
@given(area=small_texts)
def test_the_line_rule_finds_the_same_line(area):
    assert replies._first_line_ending_in_paren(area) == plain_first_line_ending_in_paren(area)


@SMALL
@given(text=small_texts, limit=st.sampled_from([0, 5, 80, 160]))
def test_quotes_read_as_far_as_they_show_are_the_same(text, limit):
    assert replies._quote(text, limit) == plain_quote(text, limit)
    middle = len(text) // 2
    assert replies._quote(text, limit, 3, middle) == plain_quote(text[3:middle], limit)


@SMALL
@given(line=st.text(alphabet=" \t>*_#+`-FINAL(x", max_size=14))
def test_the_marker_pattern_matches_where_it_did(line):
    old = [(m.start(), m.end()) for m in PLAIN_MARKER.finditer(line)]
    assert [(m.start(), m.end()) for m in replies._MARKER.finditer(line)] == old


# -- typed answers ---------------------------------------------------------------------------
def untrusted(schema):
    return structured.AnswerFormat(schema, trusted=False)


def test_unique_items_of_3000_distinct_objects_are_checked_in_linear_time():
    answer = json.dumps([{"id": i, "tags": [i, str(i)]} for i in range(3_000)])
    checked, seconds = cpu_seconds(untrusted({"type": "array", "uniqueItems": True}).parse, answer)
    assert len(checked) == 3_000
    assert seconds < 0.5  # pairwise: 10 s


def test_unique_items_names_the_two_equal_items():
    fmt = untrusted({"type": "array", "uniqueItems": True})
    with pytest.raises(InvalidAnswer, match="items 1 and 3 are equal, and must be unique"):
        fmt.parse('[{"a": 1}, {"a": [1.0, true]}, 2, {"a": [1, true]}]')


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.sampled_from([0.0, 1.0, 2.5, -0.0])
    | st.text(alphabet="ab", max_size=2),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet="ab", max_size=1), inner, max_size=3)
    ),
    max_leaves=8,
)


UNIQUE = untrusted({"type": "array", "uniqueItems": True})
PLAIN_UNIQUE = jsonschema.Draft202012Validator(UNIQUE.schema)


@settings(SMALL, max_examples=150)
@given(items=st.lists(json_values, max_size=6))
def test_unique_items_tells_equal_values_apart_as_json_schema_does(items):
    # 1 and 1.0 are equal, true and 1 are not, in arrays and objects alike.
    expected = PLAIN_UNIQUE.is_valid(items)
    try:
        UNIQUE.parse(json.dumps(items))
        valid = True
    except InvalidAnswer:
        valid = False
    assert valid == expected


alternatives = st.lists(
    st.one_of(
        json_values.map(lambda value: {"const": value}),
        st.lists(json_values, min_size=1, max_size=3).map(lambda values: {"enum": values}),
        st.sampled_from(["string", "number", "integer", "object", "array", "null"]).map(
            lambda kind: {"type": kind}
        ),
        st.just({"type": "array", "items": {"type": "integer"}}),  # not simple: as before
    ),
    min_size=1,
    max_size=4,
)


@settings(SMALL, max_examples=150)
@given(choices=alternatives, instance=json_values, keyword=st.sampled_from(["anyOf", "oneOf"]))
def test_any_of_and_one_of_decide_as_json_schema_does(choices, instance, keyword):
    # Alternatives that only name a const, an enum or a type are tried without errors.
    schema = {keyword: choices}
    expected = jsonschema.Draft202012Validator(schema).is_valid(instance)
    try:
        untrusted(schema).parse(json.dumps(instance))
        valid = True
    except InvalidAnswer:
        valid = False
    assert valid == expected


def test_numbers_chosen_to_share_a_hash_do_not_make_unique_items_quadratic():
    # Python hashes n and n + k * (2**61 - 1) alike; the keys are salted strings.
    answer = "[" + ",".join(str(7 + k * (2**61 - 1)) for k in range(20_000)) + "]"
    _, seconds = cpu_seconds(untrusted({"uniqueItems": True}).parse, answer)
    assert seconds < 0.5


# Schemas whose checks cost more than one step each, as model code may write them, and
# answers of many shapes to check against them.
COSTLY_SCHEMAS = [
    {"type": "array", "uniqueItems": True},
    {"type": "array", "items": {"enum": [{"k": [i, i]} for i in range(300)]}},
    {"anyOf": [{"type": "string"}] * 600},
    {"type": "array", "items": {"anyOf": [{"const": i} for i in range(100)]}},
    {"type": "array", "items": {"required": ["x" * 90_000]}},
    {"type": "array", "items": {"const": "y" * 90_000}},
    {"type": "array", "contains": {"type": "object"}, "items": {"not": {"type": "null"}}},
    {"oneOf": [{"type": "array", "items": {"type": "object"}}] * 400},
]
answer_items = st.sampled_from(
    ['{"k": [1, 1]}', '"' + "z" * 500 + '"', "[[[[1]]]]", "7", '{"a": {"b": [true]}}', "null"]
)


@settings(LARGE, max_examples=8)
@given(
    schema=st.sampled_from(COSTLY_SCHEMAS),
    item=answer_items,
    count=st.integers(min_value=1_000, max_value=40_000),
    distinct=st.booleans(),
)
def test_a_call_checks_any_answer_within_its_cpu_allowance(schema, item, count, distinct):
    items = [f'{{"n": {i}, "v": {item}}}' if distinct else item for i in range(count)]
    answer = "[" + ",".join(items) + "]"
    fmt = untrusted(schema)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(structured.checks, "MAX_CHECK_SECONDS", 0.2)  # the bound, made quick
        allowance = structured.Allowance()
    for _ in range(2):  # its answer, and the one asked again
        _, seconds = cpu_seconds(fmt.parse, answer, allowance)
        # Decoding (not stoppable; under 0.1 s at 4 MB) and a step past the deadline.
        assert seconds <= 0.2 + 0.15 + 0.05 * len(answer) / 2**20, (schema, item, count)


def test_an_answer_over_the_size_or_value_limits_is_refused_before_it_is_decoded():
    fmt = untrusted({"type": "array"})
    for answer in ("[" + "0," * 2_200_000 + "0]", "[" + "{}," * 300_000 + "{}]"):
        outcome, seconds = cpu_seconds(fmt.parse, answer)
        assert isinstance(outcome, structured.AnswerTooCostly)
        assert "a typed answer may hold" in str(outcome)
        assert seconds < 0.05
    notebook = structured.AnswerFormat({"type": "array"})
    with pytest.raises(structured.AnswerTooCostly, match="over the 200,000"):
        notebook.parse("[" + "{}," * 300_000 + "{}]")


def test_an_answer_nested_past_what_json_reads_is_one_clear_error():
    with pytest.raises(InvalidAnswer, match="nested too deeply to read"):
        untrusted({"type": "array"}).parse("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"a": 1}\n```',
        '  ```\n{"a": 1}\n\n```  ',
        '```json \n {"a": 1} \n ```',
        '{"a": 1}',
    ],
)
def test_json_in_a_code_fence_is_read_as_before(text):
    assert structured.AnswerFormat({"type": "object"}).parse(text) == {"a": 1}


def test_an_answer_of_blank_lines_in_a_fence_is_refused_at_once():
    # The fence pattern backtracked for minutes over 2,000 blank lines, on the loop.
    outcome, seconds = cpu_seconds(
        structured.AnswerFormat({"type": "object"}).parse, "```\n" + "\n" * 200_000 + "x"
    )
    assert isinstance(outcome, InvalidAnswer)
    assert seconds < 0.05


@pytest.mark.parametrize("keyword", ["unevaluatedProperties", "unevaluatedItems"])
def test_a_schema_from_model_code_may_not_walk_itself_again_per_property(keyword):
    with pytest.raises(ConfigError, match=f"may not use {keyword}"):
        untrusted({"type": "object", keyword: False})
    structured.AnswerFormat({"type": "object", keyword: False})  # the notebook's may


async def test_a_check_stops_when_the_call_waiting_for_it_is_cancelled():
    fmt = untrusted({"type": "array", "items": {"anyOf": [{"const": i} for i in range(100)]}})
    answer = json.dumps([99] * 20_000)  # about 2 s of checks at full allowance
    loop = asyncio.get_running_loop()
    started, ended = threading.Event(), asyncio.Event()
    parse = fmt.parse

    def watched_parse(text, allowance=None):
        started.set()
        try:
            return parse(text, allowance)
        finally:
            loop.call_soon_threadsafe(ended.set)

    fmt.parse = watched_parse  # type: ignore[method-assign]
    check = asyncio.ensure_future(fmt.checked(answer))
    while not started.is_set():
        await asyncio.sleep(0.001)
    check.cancel()
    cancelled = time.perf_counter()
    await asyncio.wait_for(ended.wait(), 5)
    assert time.perf_counter() - cancelled < 0.2  # at its next step, not 1 s later


# -- what the sandbox sends --------------------------------------------------------------
frame_values = st.recursive(
    st.text(alphabet=',"[{\\é\U0001f600 a', max_size=40) | st.integers() | st.floats(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=12,
)


@LARGE
@given(value=frame_values, copies=st.integers(min_value=1, max_value=20_000))
def test_a_frame_of_any_shape_is_checked_and_decoded_in_time_linear_in_its_size(value, copies):
    body = bridge.frame({"op": "x", "v": [value] * copies})[bridge.HEADER.size :]
    if len(body) > bridge.MAX_FROM_SANDBOX:
        return

    def read(body):
        bridge.check_body(body)
        return bridge.parse_json(body)

    outcome, seconds = cpu_seconds(read, body)
    assert isinstance(outcome, (dict, bridge.BridgeError))
    assert within_linear_bound(seconds, len(body))


def test_a_frame_nested_past_what_json_reads_is_refused_as_one():
    body = b'{"op": "x", "v": ' + b"[" * 40_000 + b"]" * 40_000 + b"}"
    bridge.check_body(body)  # within the values a frame may hold
    with pytest.raises(bridge.BridgeError, match="nested too deeply"):
        bridge.parse_json(body)


error_units = st.sampled_from(["'Error: x', ", '"Error: \\"y", ', "'Error:\\n'", "[", "' ", "\\"])


@LARGE
@given(unit=error_units, size=st.integers(min_value=10_000, max_value=990_000))
def test_an_answer_read_for_errors_is_read_in_time_linear_in_its_size(unit, size):
    answer = "[" + unit * (size // len(unit))
    _, seconds = cpu_seconds(is_error, answer)
    _, closed = cpu_seconds(is_error, answer + "]")
    assert within_linear_bound(max(seconds, closed), len(answer))
