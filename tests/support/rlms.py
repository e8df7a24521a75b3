"""The RLM and notebook helpers a test starts from, pointed at the local server, and the
way a test runs a cell as the kernel would."""

from __future__ import annotations

from rlm_magic import RLM
from rlm_magic.jupyter.helpers import NotebookHelpers

ROOT, SUB = "openai/root-model", "openai/sub-model"


def helpers(rlm: RLM) -> NotebookHelpers:
    """The notebook's helpers bound to ``rlm``, as ``%load_ext rlm_magic`` puts them in a
    notebook."""
    return NotebookHelpers(rlm)


def server_settings(server) -> dict:
    """The settings every test's RLM starts from: the local server, fast retries."""
    return dict(
        model=ROOT,
        sub_model=SUB,
        api_base=server.base_url,
        api_key="sk-test",
        retry_backoff=0.01,
        progress=False,
        timeout=10,
    )


def make_rlm(server, **settings) -> RLM:
    return RLM(**{**server_settings(server), **settings})


async def cell_result(shell, code: str):
    """Run a cell as the kernel would (input transformers, top-level await): its
    ``ExecutionResult``, whose error a test reads (a KeyboardInterrupt raised out of a
    task would escape the test's event loop)."""
    return await shell.run_cell_async(code, transformed_cell=shell.transform_cell(code))


async def run_cell(shell, code: str):
    """Run a cell as the kernel would and raise its error, so a failing cell fails the
    test."""
    result = await cell_result(shell, code)
    error = result.error_before_exec or result.error_in_exec
    if error is not None:
        raise error
    return result.result
