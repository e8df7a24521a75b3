"""A run's overrides are one list (``RunOverrides``): ``RLM.arun`` spells them out for
IDE help, ``RLM.start`` and ``Run`` take the dataclass, and the lists cannot drift
apart. A run's parts share one ``RunScope``."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from rlm_magic import RLM, ConfigError
from rlm_magic.rlm.run import Run
from rlm_magic.rlm.scope import RunOverrides, RunScope

from .support import SUB, make_rlm, repl


def _keyword_only(function) -> dict[str, str]:
    parameters = inspect.signature(function).parameters.values()
    return {p.name: str(p.annotation) for p in parameters if p.kind is p.KEYWORD_ONLY}


def test_arun_spells_out_exactly_the_overrides_a_run_takes():
    fields = {field.name: str(field.type) for field in dataclasses.fields(RunOverrides)}
    assert _keyword_only(RLM.arun) == fields  # names and types alike
    assert all(field.default is None for field in dataclasses.fields(RunOverrides))


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(RunOverrides)])
def test_start_takes_each_override_and_nothing_else(server, name):
    rlm = make_rlm(server, sandbox="none")
    value = {"max_iterations": 3, "max_depth": 0, "sandbox": "none", "namespace": None}.get(
        name, "session-a" if name == "session" else "openai/other-model"
    )
    run = rlm.start("q", "c", **{name: value})
    if name in ("model", "sub_model", "max_iterations", "max_depth"):
        assert getattr(run.settings, name) == value
    if name == "sandbox":
        assert run.settings.sandbox.name == value  # the backend it names
    if name == "session":
        assert run.session is rlm.sessions["session-a"]  # a name is looked up
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_iteration'"):
        rlm.start("q", "c", max_iteration=3)


def test_a_run_by_session_name_needs_the_rlm_to_look_it_up(server):
    rlm = make_rlm(server)
    with pytest.raises(ConfigError, match="session 'notes' is a name"):
        Run(rlm, rlm.client, "q", "c", RunOverrides(session="notes"))


def test_a_session_still_cannot_run_in_the_notebooks_namespace(server):
    rlm = make_rlm(server)
    with pytest.raises(ConfigError, match="cannot run in the notebook's namespace"):
        rlm.start("q", "c", session="s", namespace={})


async def test_a_child_run_shares_its_parents_scope_one_level_deeper(server, monkeypatch):
    rlm = make_rlm(server, sandbox="none", max_depth=2, max_iterations=4)
    server.reply_with("sub-model", "FINAL(child answer)")
    server.script("root-model", [repl("from_child = rlm_query('sub-question')"), "FINAL(done)"])
    run = rlm.start("q", "c")
    scopes: list[RunScope] = []
    made = RunScope.of

    def recorded(cls, *args, **kwargs):
        scopes.append(made(*args, **kwargs))
        return scopes[-1]

    monkeypatch.setattr(RunScope, "of", classmethod(recorded))
    result = await run.execute()
    assert result.success and result.variables["from_child"] == "child answer"
    (child,) = scopes
    assert child.tree is run.scope.tree and child.depth == 1
    assert child.settings.model == child.settings.sub_model == SUB
    assert (child.settings.max_iterations, child.settings.max_depth) == (4, 2)
    assert child.deadline is not None  # within the parent's step
