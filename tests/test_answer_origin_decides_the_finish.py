"""An answer's origin decides, not its spelling: an answer the model typed is not taken
from a reply whose code read data it had not seen; an answer computed from data is
taken at once; a reply whose code read no data finishes with what it wrote down.

Generated over many spellings (Hypothesis): the finish forms (FINAL, FINAL_VAR by name
and bare, print(FINAL(...)), a printed marker, the answer dict, a helper function, a
marker in prose), the expressions (literals, arithmetic, formatting, joins,
comprehensions, lambdas, helper functions), and where the code that read data stands
(the finishing block, or a block before it). Each case runs in a real in-process REPL,
judged by the run's own ``Finishing``."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlm_magic.repl.finishers import FinishKind
from rlm_magic.repl.helpers import BATCH_NAMES, HELPER_NAMES
from rlm_magic.repl.inprocess import AsyncREPL
from rlm_magic.repl.provenance import answer_digest, replay
from rlm_magic.repl.steps import compile_step, preloaded, repl_builtins
from rlm_magic.rlm.finishing import Finishing
from rlm_magic.rlm.replies import read_reply
from rlm_magic.rlm.result import CodeRun, Iteration, RLMResult

CONTEXT = "\n".join(f"2026-01-01 12:00:{i:02d} checkout timeout {i}" for i in range(20))
SUB_ANSWER = "checkout, 20 timeouts"

# Spellings of a value the model typed (all 7, or text around it).
TYPED = [
    '"7"',
    "7",
    "3 + 4",
    'f"{7}"',
    'f"{3 + 4} lines"',
    '"{} lines".format(7)',
    '"There are %d lines" % 7',
    '" ".join(["7", "lines"])',
    "str(7)",
    '"".join(reversed("7"))',
    '[x for x in ["7"]][0]',
    '(lambda: "7")()',
    "max([3, 7])",
    "sum([3, 4])",
    'int("7")',
    '"7" if True else "8"',
    'dict(n="7")["n"]',
    '"seven".replace("seven", "7")',
    'str(len("1234567"))',
    'b"7".decode()',
    '"{n} lines".format(n=7)',
    'next(iter(["7"]))',
    'sorted({"7", "1"})[-1]',
    "round(7.2)",
    "chr(55)",
    '{"a": [7]}["a"][0]',
]
# Values computed from the data: the context, or a sub-model's answer.
COMPUTED = [
    "len(context.splitlines())",
    "context.count(chr(10))",
    "context.splitlines()[0]",
    "len(context)",
    'llm_query("How many lines?")',
    "sorted(set(context.split()))[0]",
    "max(context.splitlines(), key=len)",
    "context[:4]",
    "sum(1 for _ in context.splitlines())",
    'llm_query_batch(["a", "b"])[0]',
    'len([line for line in context.splitlines() if "timeout" in line])',
    "context.split()[-1]",
]
# Ways to wrap a value; Q is a quote the wrapped code does not use (an f-string may not
# hold its own quote before Python 3.12).
WRAPPERS = [
    "str({})",
    "fQ{{({})}} linesQ",
    "Q{{}}Q.format({})",
    "[{}][0]",
    "(lambda: {})()",
    "Q%sQ % ({},)",
    "Q Q.join([str({})])",
    "({})",
]


def quoted(template: str, inner: str) -> str:
    """``template`` around ``inner``, with a quote ``inner`` does not use."""
    quote = next((q for q in "\"'" if q not in inner), None)
    if quote is None:
        return f"str({inner})"
    return template.replace("Q", quote).format(inner)


READS_DATA = [
    "print(len(context.splitlines()))",
    "n = len(context.splitlines())\nprint(n)",
    "lines = context.splitlines()",
    'x = llm_query("Count the lines")',
    "print(context[:50])",
    "print(SHOW_VARS())\nprint(len(context))",
]
READS_NOTHING = ["", "import re", "v0 = 1", 'print("working on it")', "steps = [1, 2, 3]"]


def finishes(expr: str) -> list[str]:
    """The ways a block finishes with ``expr``'s value."""
    return [
        f"FINAL({expr})",
        f'v = {expr}\nFINAL_VAR("v")',
        f"v = {expr}\nFINAL_VAR(v)",
        f"print(FINAL({expr}))",
        # a printed marker, where a quote is left for its f-string
        quoted("print(fQFINAL({{({})}})Q)", expr)
        if "'" not in expr or '"' not in expr
        else f"FINAL({expr})",
        f"answer.update(content=str({expr}), ready=True)",
        f'answer["content"] = str({expr})\nanswer["ready"] = True',
        f"def give():\n    return {expr}\nFINAL(give())",
    ]


def expressions(bases: list[str]) -> st.SearchStrategy[str]:
    base = st.sampled_from(bases)
    return st.recursive(
        base, lambda inner: st.builds(quoted, st.sampled_from(WRAPPERS), inner), max_leaves=3
    )


@st.composite
def replies(draw, values: list[str], before: list[str]) -> list[str]:
    """A reply's blocks: code before the finish (in its block or one of its own), then
    one way to finish with a generated expression."""
    expr = draw(expressions(values))
    finish = draw(st.sampled_from(finishes(expr)))
    pre = draw(st.sampled_from(before))
    if not pre:
        return [finish]
    return [pre, finish] if draw(st.booleans()) else [f"{pre}\n{finish}"]


async def _sub_model(prompts=None, *args, **kwargs):
    return SUB_ANSWER


async def _sub_model_batch(prompts=None, *args, **kwargs):
    return [SUB_ANSWER for _ in prompts]


def new_repl() -> AsyncREPL:
    namespace = {"__name__": "__rlm__", "__builtins__": repl_builtins()}
    namespace.update(preloaded(namespace, CONTEXT))
    helpers = {n: _sub_model_batch if n in BATCH_NAMES else _sub_model for n in HELPER_NAMES}
    return AsyncREPL(namespace, helpers)


async def taken(blocks: list[str], prose: str | None = None, repl: AsyncREPL | None = None):
    """Whether the run takes the answer the reply gives, as ``Run`` acts on a reply."""
    repl = repl or new_repl()
    finishing = Finishing(RLMResult(query="q"))
    finishing.repl = repl
    iteration = Iteration(index=1, response="")
    for number, code in enumerate(blocks, 1):
        step = await repl.run(code, timeout=10)
        error = step.error is not None
        iteration.code.append(CodeRun(code, step.as_text(), step.elapsed_s, error=error))
        assert not error, step.error
        if step.finish:
            return await finishing.by_block(step.finish, [], iteration, number, code)
    marker = read_reply(prose or "").final
    assert marker is not None
    answer, _ = await finishing.from_text(marker, iteration)
    return answer is not None


PROPERTY = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@PROPERTY
@given(replies(TYPED, READS_DATA))
def test_a_typed_answer_after_code_that_read_data_is_never_taken(blocks):
    assert not asyncio.run(taken(blocks)), blocks


@PROPERTY
@given(replies(COMPUTED, READS_DATA + READS_NOTHING))
def test_an_answer_computed_from_data_is_taken_at_once(blocks):
    assert asyncio.run(taken(blocks)), blocks


@PROPERTY
@given(replies(TYPED, READS_NOTHING))
def test_a_reply_that_read_no_data_finishes_with_what_it_wrote_down(blocks):
    assert asyncio.run(taken(blocks)), blocks


@settings(max_examples=100, deadline=None)
@given(expressions(TYPED), st.sampled_from(READS_DATA), st.booleans())
def test_a_prose_answer_after_code_that_read_data_is_taken_only_from_data(expr, pre, by_name):
    blocks = [f"{pre}\nv = {expr}"]
    prose = "FINAL_VAR(v)" if by_name else f"FINAL({expr})"
    assert not asyncio.run(taken(blocks, prose)), (blocks, prose)


@pytest.mark.parametrize("pre", READS_DATA)
async def test_a_prose_variable_computed_from_data_is_taken(pre):
    assert await taken([f"{pre}\nv = len(context.splitlines())"], "FINAL_VAR(v)")


# -- the shapes the issue names, and ones it does not ------------------------------------
@pytest.mark.parametrize(
    "finish",
    [
        'FINAL(f"{7} lines")',
        "FINAL(3 + 4)",
        'FINAL("{} lines".format(7))',
        'FINAL("There are %d lines" % 7)',
        'FINAL(" ".join(["7", "lines"]))',
        "answer.update(content=str(7), ready=True)",
        'print(f"FINAL({7} lines)")',
        'FINAL(__import__("functools").reduce(lambda a, b: a + b, [3, 4]))',
        "FINAL(globals().get('undefined', 7))",
        "import math\nFINAL(math.isqrt(49))",
    ],
)
async def test_the_named_invented_finishes_are_withheld(finish):
    assert not await taken([f"print(len(context.splitlines()))\n{finish}"])


@pytest.mark.parametrize(
    "blocks",
    [
        ["v = '42'\nprint(FINAL(v))"],
        ["v = '42'\nFINAL(v)"],
        ["v = '42'\nanswer['content'] = v\nanswer['ready'] = True"],
        ["v = '42'", "print(FINAL_VAR('v'))"],
    ],
)
async def test_a_reply_that_writes_its_answer_down_finishes_in_its_turn(blocks):
    assert await taken(blocks)


async def test_an_answer_from_a_variable_of_an_earlier_turn_counts_as_data():
    repl = new_repl()
    await repl.run("counts = {'checkout': len(context.splitlines())}")
    assert await taken(["print(counts)\nFINAL(str(counts['checkout']))"], repl=repl)


async def test_a_replay_changes_nothing_the_model_made():
    repl = new_repl()
    await repl.run("seen = []\ntotal = {'n': 1}\ndef note(x):\n    seen.append(x)")
    await repl.run("note(context[:4])\ntotal['n'] += 1\nFINAL(str(total['n']))")
    before = {k: repr(v) for k, v in repl.namespace.items() if k in ("seen", "total")}
    found = await repl.replay(["note(context[:4])\ntotal['n'] += 1\nFINAL(str(total['n']))"])
    assert found.read_data is True and found.digests
    assert {k: repr(repl.namespace[k]) for k in before} == before


def test_a_replay_opens_no_file_and_answers_sub_calls_locally(tmp_path):
    namespace = {"__name__": "__rlm__", "__builtins__": repl_builtins()}
    namespace.update(preloaded(namespace, CONTEXT))
    target = tmp_path / "written.txt"
    code = f"open({str(target)!r}, 'w').write('x')\nFINAL(llm_query('q'))"
    found = replay([code], namespace, set(HELPER_NAMES), compile_step)
    assert not target.exists() and found.digests == [None, None]


@pytest.mark.parametrize("pre", [p for p in READS_NOTHING if p])
async def test_a_prose_answer_after_code_that_read_no_data_is_taken(pre):
    assert await taken([pre], "FINAL(7)")


def test_a_replay_copies_only_what_the_reply_reads_and_stops_once_settled():
    namespace = {"__name__": "__rlm__", "__builtins__": repl_builtins()}
    namespace.update(preloaded(namespace, "x" * 300_000_000))  # past what a world copies
    found = replay(["v = '42'\nFINAL(v)"], namespace, set(HELPER_NAMES), compile_step)
    assert found.read_data is False and found.digests[0] is not None


def test_a_computed_answer_costs_one_world_and_a_typed_one_every_world():
    namespace = {"__name__": "__rlm__", "__builtins__": repl_builtins()}
    namespace.update(preloaded(namespace, CONTEXT))

    def worlds_run(code: str, answer: str) -> int:
        digest = answer_digest(FinishKind.CALL_IN_CODE.value, answer)
        found = replay([code], namespace, set(HELPER_NAMES), compile_step, answer=digest)
        return len(found.digests)

    assert worlds_run("FINAL(context[:4])", CONTEXT[:4]) == 1
    assert worlds_run("n = len(context)\nFINAL('7')", "7") == 2


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.remove({path!r})\nFINAL(context[:4])",
        "import pathlib\npathlib.Path({path!r}).unlink()\nFINAL(context[:4])",
        "from shutil import rmtree\nFINAL(context[:4])",
        "import subprocess\nsubprocess.run(['rm', {path!r}])\nFINAL(context[:4])",
    ],
)
def test_a_replay_acts_on_nothing_outside_the_process(tmp_path, code):
    target = tmp_path / "kept.txt"
    target.write_text("x")
    namespace = {"__name__": "__rlm__", "__builtins__": repl_builtins()}
    namespace.update(preloaded(namespace, CONTEXT))
    found = replay([code.format(path=str(target))], namespace, set(HELPER_NAMES), compile_step)
    assert target.exists() and found.digests == [None, None]


def test_a_replay_reads_text_through_in_memory_buffers():
    namespace = {"__name__": "__rlm__", "__builtins__": repl_builtins()}
    namespace.update(preloaded(namespace, CONTEXT))
    code = "import io\nFINAL(io.StringIO(context).readline())"
    digest = answer_digest(FinishKind.CALL_IN_CODE.value, CONTEXT.splitlines()[0] + "\n")
    found = replay([code], namespace, set(HELPER_NAMES), compile_step, answer=digest)
    assert found.digests[0] not in (None, digest)


def test_a_replay_writes_no_file_through_a_library_and_makes_no_real_sub_call(tmp_path):
    target = tmp_path / "report.csv"
    calls = []

    async def counted(prompt=None, *args, **kwargs):
        calls.append(prompt)
        return SUB_ANSWER

    code = (
        "import csv as c, codecs\n"
        f"with codecs.open({str(target)!r}, 'w') as f:\n"
        "    f.write(context[:20])\n"
        "ask = llm_query\n"
        "FINAL(ask('q') + context[:4])"
    )

    async def run():
        repl = new_repl()
        repl._helpers = {**repl._helpers, "llm_query": counted}
        step = await repl.run(code, timeout=10)
        assert step.finish and not step.error, step.error
        written = target.read_text()
        found = await repl.replay([code], timeout=10)
        return written, found

    written, found = asyncio.run(run())
    assert target.read_text() == written == CONTEXT[:20]
    assert len(calls) == 1 and found.digests == [None, None]


@pytest.mark.parametrize(
    "code",
    [
        "import json\ndata = json.loads(context)\nprint(len(data))\nFINAL(str(len(data)))",
        "import json\ndata = json.loads(context)\nFINAL(max(d['n'] for d in data))",
    ],
)
async def test_an_answer_computed_from_a_json_context_is_taken(code):
    repl = new_repl()
    repl.namespace["context"] = '[{"n": 3, "status": "open"}, {"n": 9, "status": "done"}]'
    assert await taken([code], repl=repl)


async def test_a_typed_answer_the_replay_cannot_tell_is_withheld_when_the_code_writes_it():
    repl = new_repl()
    repl.namespace["context"] = '[{"n": 3}, {"n": 9}]'
    code = "import json\ndata = json.loads(context)\nprint(len(data))\nFINAL('7')"
    assert not await taken([code], repl=repl)


async def test_a_replay_leaves_closures_defaults_bound_methods_and_random_as_they_were():
    import random

    repl = new_repl()
    await repl.run(
        "results = []\npush = results.append\n"
        "def keep(x, seen=[]):\n    seen.append(x)\n    return len(seen)\n"
        "def counter():\n    box = []\n    def add(x):\n        box.append(x)\n"
        "        return box\n    return add\nadd = counter()"
    )
    code = "push(context[:4])\nkeep(context[:4])\nadd(context[:4])\nFINAL(context[:4])"
    await repl.run(code)
    before = (list(repl.namespace["results"]), repl.namespace["keep"].__defaults__[0][:])
    boxed = list(repl.namespace["add"].__closure__[0].cell_contents)
    state = random.getstate()
    await repl.replay([code], answer="0" * 64)
    assert (repl.namespace["results"], repl.namespace["keep"].__defaults__[0]) == before
    assert repl.namespace["add"].__closure__[0].cell_contents == boxed
    assert random.getstate() == state
