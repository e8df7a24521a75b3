"""Whatever the sandbox sends, the kernel's loop and memory stay bounded (issue 26).

Hostile ```repl blocks from a scripted root model, through a real ``RLM.arun`` against
the local test server: schemas built to cost exponential time or seconds of checking,
errors that would quote megabytes once per prompt, replies the sandbox never reads, and
answers the kernel would once have evaluated. Each is refused or cut short in a way the
model reads, and the kernel's loop keeps turning (a 5 ms heartbeat measures it). The
bounds are generous: ``benchmarks/bench_sandbox.py`` measures the figures.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from rlm_magic.llm import structured
from rlm_magic.repl.sandbox import calls
from rlm_magic.rlm.finishing import is_error

from .support import eventually, make_rlm, outputs, repl

pytestmark = pytest.mark.usefixtures("server")


class Heartbeat:
    """The event loop's longest stall while the block runs."""

    async def __aenter__(self):
        self.longest = 0.0
        self._task = asyncio.ensure_future(self._beat())
        return self

    async def _beat(self):
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.005)
            self.longest = max(self.longest, time.perf_counter() - started - 0.005)

    async def __aexit__(self, *exc):
        self._task.cancel()


class PeakMemory:
    """How far this process's resident memory peaked above where it was."""

    def __enter__(self):
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # resets VmHWM, the peak resident size
        self.before = _status_mb("VmRSS:")
        return self

    def __exit__(self, *exc):
        self.mb = _status_mb("VmHWM:") - self.before


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    raise AssertionError(field)


async def _run(server, code: str, **settings):
    server.script("root-model", [repl(code), "FINAL(done)"])
    rlm = make_rlm(server, sandbox="process", step_timeout=20, **settings)
    async with Heartbeat() as beat:
        result = await rlm.arun("q", context="c")
    return outputs(result)[0], beat.longest


# -- schemas written by model code --------------------------------------------------------
DOUBLING_REFS = """
defs = {"a0": {"type": "string"}}
for i in range(1, 19):  # 1.3 KB that a validator would walk 262,144 times
    defs[f"a{i}"] = {"allOf": [{"$ref": f"#/$defs/a{i-1}"}, {"$ref": f"#/$defs/a{i-1}"}]}
print(llm_query("q", response_format={"$defs": defs, "$ref": "#/$defs/a18"}))
"""


async def test_a_schema_whose_references_double_per_level_is_refused_before_any_request(server):
    server.reply_with("sub-model", lambda body: '"x"')
    printed, stall = await _run(server, DOUBLING_REFS)
    assert printed.startswith(
        "Error: response_format from model code may take at most 10,000 schema nodes "
        "once its $refs are followed"
    )
    assert server.requests_for("sub-model") == []
    assert stall < 1.0  # was 8 s


async def test_a_schema_of_24000_alternatives_is_refused_before_it_is_checked(server):
    code = (
        "schema = {'anyOf': [{'const': f'v{i}'} for i in range(24_000)]}\n"
        "print(llm_query('q', response_format=schema))"
    )
    printed, stall = await _run(server, code)
    assert printed == (
        "Error: response_format from model code may hold at most 2,000 values; this one holds more"
    )
    assert server.requests_for("sub-model") == []
    assert stall < 1.0  # was 9 s in the schema check alone


@pytest.mark.parametrize(
    "schema, complaint",
    [
        (
            {
                "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                "$ref": "#/$defs/n",
            },
            "may not refer to itself",
        ),
        ({"$ref": "#/$defs/missing"}, "names nothing in the schema"),
        ({"$anchor": "a", "type": "string"}, "may not use $anchor"),
        ({"$dynamicRef": "#a"}, "may not use $dynamicRef"),
        ({"description": "x" * 100_001}, "at most 100,000 characters"),
    ],
)
def test_what_a_schema_from_model_code_may_not_hold(schema, complaint):
    with pytest.raises(structured.ConfigError, match=complaint.replace("$", r"\$")):
        structured.AnswerFormat(schema, trusted=False)


def test_the_same_schemas_are_accepted_from_the_notebook():
    recursive = {"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}
    fmt = structured.AnswerFormat({**recursive, "$ref": "#/$defs/n"})
    assert fmt.parse("[[[]], []]") == [[[]], []]


async def test_an_answer_too_costly_to_check_fails_at_once_without_being_asked_again(server):
    # 5,000 items, each tried against 100 alternatives: 500,000 checks, over the budget.
    server.reply_with("sub-model", lambda body: json.dumps([99] * 5_000))
    code = (
        "schema = {'type': 'array', 'items': {'anyOf': [{'const': i} for i in range(100)]}}\n"
        "print(llm_query('q', response_format=schema))"
    )
    printed, stall = await _run(server, code)
    assert "the answer could not be checked: checking it against this schema takes more" in (
        printed
    )
    assert len(server.requests_for("sub-model")) == 1  # asking again would cost as much
    assert stall < 0.5  # checked in a thread: the loop turns meanwhile


async def test_an_answer_within_the_budget_is_checked_as_before(server):
    server.reply_with("sub-model", lambda body: json.dumps([99] * 500))
    code = (
        "schema = {'type': 'array', 'items': {'anyOf': [{'const': i} for i in range(100)]}}\n"
        "answer = llm_query('q', response_format=schema)\n"
        "print(len(answer), answer[0])"
    )
    printed, _ = await _run(server, code)
    assert printed == "500 99"


async def test_an_invalid_schema_is_quoted_as_an_excerpt_once_per_prompt(server):
    # A schema quoted whole in each of 400 errors (at 0.96 MB, a 477 MB reply and +1.1 GB
    # of kernel): now at most 100,000 characters, quoted at most 300 at a time.
    code = (
        "schema = {'type': 'object', 'properties': {'k': {'type': ['x' * 99_000]}}}\n"
        "errors = llm_query_batch(['p'] * 400, response_format=schema)\n"
        "print(len(errors), max(len(e) for e in errors), errors[0][:48])"
    )
    with PeakMemory() as memory:
        printed, stall = await _run(server, code)
    count, longest, start = printed.split(" ", 2)
    assert count == "400" and int(longest) < 400
    assert start == "Error: response_format is not a valid JSON schem"
    assert memory.mb < 100 and stall < 1.0
    assert server.requests_for("sub-model") == []


# -- replies ------------------------------------------------------------------------------
STOP_READING = """
import gc, json, os, struct, sys, time
worker = next(o for o in gc.get_objects() if type(o).__name__ == "Worker")
worker.calls_lock.acquire()  # its bridge thread stops at the first answer it reads
for i in range(400):  # each answered with 256 KB, that nothing reads
    body = json.dumps({"op": "call", "id": 10_000 + i, "step": worker.current_step,
                       "name": "llm_query", "args": [f"p{i}"], "kwargs": {}}).encode()
    os.write(int(sys.argv[1]), struct.pack(">cQ", b"J", len(body)) + body)
time.sleep(30)
"""


async def test_a_sandbox_that_does_not_read_its_replies_is_stopped_not_buffered_for(server):
    server.reply_with("sub-model", lambda body: "y" * 2**18)
    with PeakMemory() as memory:
        started = time.monotonic()
        printed, stall = await _run(server, STOP_READING)
    assert "SandboxError: it did not read the kernel's replies" in printed
    assert "at most 32 MB may" in printed
    assert time.monotonic() - started < 20  # stopped, not timed out
    assert memory.mb < 400 and stall < 1.0  # 20 unread replies grew it by 2 GB


async def test_a_large_batch_answer_arrives_whole_sent_in_parts(server):
    server.reply_with("sub-model", lambda body: "y" * 200_000)
    code = (
        "answers = llm_query_batch([f'p{i}' for i in range(200)])\n"
        "print(len(answers), {len(a) for a in answers})"
    )
    with PeakMemory() as memory:
        printed, stall = await _run(server, code)
    assert printed == "200 {200000}"  # 38 MB as sent: a frame would have held it all
    assert len(server.requests_for("sub-model")) == 200
    assert memory.mb < 150 and stall < 1.0


async def test_one_answer_over_the_reply_limit_is_an_error_in_its_place(server, monkeypatch):
    monkeypatch.setattr(calls, "MAX_REPLY", 2**20)
    server.reply_with("sub-model", lambda body: json.dumps({"k": "y" * 1_500_000}))
    code = (
        "try:\n    llm_query('q', response_format={'type': 'object'})\n"
        "except RuntimeError as e:\n    print(e)"
    )
    printed, _ = await _run(server, code)
    assert printed == (
        "RuntimeError: an answer of 1 MB as sent, over the 1 MB one answer may hold: ask for "
        "a shorter one"
    )


# -- the answer ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "answer, errors_only",
    [
        ("Error: no request was sent", True),
        ("['Error: a', 'Error: b']", True),
        ("('Error: a',)", True),
        ("[\"Error: it's\", 'Error: b', ]", True),
        ("['\\nError: a']", True),
        ("['Error: a', 'fine']", False),
        ("['Error: a' 'b']", False),
        ("['Error: a'], ['Error: b']", False),
        ("[]", False),
        ("[1, 2]", False),
    ],
)
def test_an_answer_of_only_error_strings_is_told_apart_without_evaluating_it(answer, errors_only):
    assert is_error(answer) is errors_only


async def test_a_1_mb_list_answer_costs_the_kernel_little(server):
    server.script("root-model", [repl('FINAL("[" + "0," * 499_998 + "0]")')])
    with PeakMemory() as memory:
        async with Heartbeat() as beat:
            result = await make_rlm(server, sandbox="process").arun("q", context="c")
    assert result.final_answer.startswith("[0,0,") and len(result.final_answer) == 999_999
    assert memory.mb < 100 and beat.longest < 0.5  # was +450 MB and 1-2 s


# -- child runs ---------------------------------------------------------------------------
async def test_rlm_query_batch_runs_at_most_max_children_sandboxes_at_once(server):
    server.model_latency = {"sub-model": 0.3}  # children's turns overlap if they can
    server.reply_with("sub-model", "FINAL(child)")
    server.script("root-model", [repl("print(rlm_query_batch(list('abcdef')))"), "FINAL(ok)"])
    rlm = make_rlm(server, sandbox="process", sandbox_max_children=2)
    result = await rlm.arun("q", context="c")
    assert outputs(result)[0] == str(["child"] * 6)  # all six, two at a time
    assert server.peak_in_flight == 2


async def test_child_sandboxes_share_the_parents_processes_and_disk(server):
    child_code = (
        "import os, resource\n"
        "disk = os.statvfs('.')\n"
        "limits = f'{resource.getrlimit(resource.RLIMIT_NPROC)[0]} "
        "{disk.f_blocks * disk.f_frsize // 2**20}'\n"
        "print(limits)"
    )
    server.script("sub-model", [repl(child_code), "FINAL_VAR(limits)"])
    server.script("root-model", [repl("print(rlm_query('a'))"), "FINAL(ok)"])
    rlm = make_rlm(
        server,
        sandbox="process",
        sandbox_max_children=4,
        sandbox_max_processes=128,
        sandbox_disk_mb=512,
    )
    result = await rlm.arun("q", context="c")
    processes, disk_mb = outputs(result)[0].split()
    if result.isolation["processes"]:
        assert processes == "32"  # 128 shared by the 4 children that may run at once
    if result.isolation["filesystem"]:
        assert disk_mb == "128"
    assert (
        result.isolation["processes"]
        or result.isolation["filesystem"]
        or pytest.skip("neither the process limit nor the working tmpfs holds here")
    )


WEDGED = """
import gc, json, os, struct, sys, time
worker = next(o for o in gc.get_objects() if type(o).__name__ == "Worker")
worker.calls_lock.acquire()  # its bridge thread stops at the next answer it reads
body = json.dumps({"op": "call", "id": 10_000, "step": worker.current_step,
                   "name": "llm_query", "args": ["wedged"], "kwargs": {}}).encode()
os.write(int(sys.argv[1]), struct.pack(">cQ", b"J", len(body)) + body)  # the test waits for it
time.sleep(30)
"""


async def test_an_interrupt_ends_the_run_within_a_second_though_the_bridge_is_wedged(server):
    server.script("root-model", [repl(WEDGED), "FINAL(done)"])
    rlm = make_rlm(server, sandbox="process", step_timeout=60)
    run = asyncio.ensure_future(rlm.arun("q", context="c"))
    assert await eventually(lambda: server.requests_for("sub-model"))
    interrupted = time.monotonic()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # SIGINT's grace (0.5 s) and the variables' wait (0.5 s), not the 5 s it was.
    assert time.monotonic() - interrupted < 2.5


async def test_a_variable_that_stayed_in_the_sandbox_shows_its_repr_without_raw_controls(server):
    code = (
        "class Thing:\n"
        "    def __repr__(self):\n"
        "        return '\\x1b[2J\\x1b]52;c;cHduZWQ=\\x07 thing'\n"
        "thing = Thing()"
    )
    server.script("root-model", [repl(code), "FINAL(done)"])
    result = await make_rlm(server, sandbox="process").arun("q", context="c")
    shown = repr(result.variables["thing"])
    assert shown == "␛[2J␛]52;c;cHduZWQ=␇ thing" and "\x1b" not in shown


def test_names_and_data_that_look_like_keywords_are_names_and_data():
    schema = {
        "type": "object",
        "properties": {"$id": {"type": "string"}, "$anchor": {"const": {"$ref": "#/nowhere"}}},
        "$defs": {"$dynamicRef": {"enum": [{"$id": "x"}]}},
    }
    fmt = structured.AnswerFormat(schema, trusted=False)
    assert fmt.parse('{"$id": "a", "$anchor": {"$ref": "#/nowhere"}}')
