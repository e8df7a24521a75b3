"""In the sandbox, a helper call still running when its step ends is stopped with the
step: model code that starts a thread calling ``llm_query`` and returns at once bills
nothing more, the call's answer never reaches the model, and the next step runs as ever."""

from __future__ import annotations

from .support import make_rlm, repl


async def test_a_call_from_a_thread_still_running_at_the_end_of_its_step_is_cancelled(server):
    rlm = make_rlm(server, sandbox="process")
    server.model_latency = {"sub-model": 5.0}
    server.script(
        "root-model",
        [
            repl(
                "import threading\nanswers = []\n"
                "threading.Thread(target=lambda: answers.append(llm_query('slow')),"
                " daemon=True).start()\nprint('started')"
            ),
            repl("import time\ntime.sleep(1)\nprint(1 + 1, [a[:6] for a in answers])"),
            "FINAL(ok)",
        ],
    )
    result = await rlm.arun("q", context="c")
    assert result.success
    first, second = (run.output for iteration in result.trajectory for run in iteration.code)
    assert first == "started"
    assert second in ("2 ['Error:']", "2 []")  # never the answer
    [call] = [record for record in rlm.client.ledger.records if record.model.endswith("sub-model")]
    assert call.error == "cancelled"
    assert call.elapsed_s < 0.8  # when its step ended, not when the run did
