"""``%%rlm --wasm`` in the real ``rlm`` kernel: model code runs in CPython compiled to
WebAssembly inside a confined Deno, reached through the public path a notebook uses, and
a notebook's interrupt stops it at once with nothing left running, as it does in a
container sandbox (issue 40)."""

from __future__ import annotations

import pytest

pytest.importorskip("jupyter_client")

from rlm_magic.repl.backends import container, wasm  # noqa: E402

from .support.kernels import interrupt_and_check, into_the_step_after_its_sub_call  # noqa: E402

pytestmark = pytest.mark.kernel
needs_wasm = pytest.mark.skipif(wasm.unavailable() is not None, reason=str(wasm.unavailable()))
needs_container = pytest.mark.skipif(
    container.unavailable() is not None, reason=str(container.unavailable())
)
ROOT, SUB = "root-model", "sub-model"  # as the server sees them

ATTACKS = r"""
import json, os
r = {}
try:
    r['own_file'] = open(context['secret_file']).read()
except OSError as e:
    r['own_file'] = type(e).__name__
import js
for name, attempt in {
    'deno_read': lambda: js.Deno.readTextFileSync(context['secret_file']),
    'deno_env': lambda: js.Deno.env.get('OPENAI_API_KEY'),
    'deno_run': lambda: js.Deno.Command.new('id').outputSync(),
    'deno_net': lambda: js.Deno.connect(js.JSON.parse('{"port": %d}' % context['port'])),
}.items():
    try:
        r[name] = str(attempt())
    except Exception as e:
        r[name] = type(e).__name__
r['granted'] = [
    name for name in ('read', 'write', 'net', 'env', 'run', 'ffi', 'sys', 'import')
    if js.Deno.permissions.querySync(js.JSON.parse('{"name": "%s"}' % name)).state == 'granted'
]
r['environ'] = sorted(os.environ)
print(json.dumps(r))
"""


def _no_deno_left(kernel) -> int:
    """Children of the kernel still running (its sandboxes are Deno processes)."""
    return kernel.value(
        "import glob, os\n_left = 0\nfor _p in glob.glob('/proc/[0-9]*/stat'):\n"
        "    try:\n        _f = open(_p).read().rsplit(')', 1)[1].split()\n"
        "    except OSError:\n        continue\n"
        "    _left += _f[1] == str(os.getpid()) and _f[0] not in 'ZX'\n_left"
    )


@needs_wasm
def test_a_cell_runs_its_model_code_in_the_wasm_sandbox(rlm_kernel, server, tmp_path):
    secret = tmp_path / "notes.txt"
    secret.write_text("the user's own secret")
    listener = __import__("socket").create_server(("127.0.0.1", 0))
    server.script(
        ROOT,
        [
            "```repl\nanswers = llm_query_batch([f'part {i}' for i in range(8)])\n"
            "print(len(answers), answers[0])\n```",
            f"```repl\n{ATTACKS.strip()}\n```",
            "```repl\nFINAL(f'{len(answers)} parts read')\n```",
        ],
    )
    rlm_kernel.run(
        f"data = {{'secret_file': {str(secret)!r}, 'port': {listener.getsockname()[1]}}}"
    )
    rlm_kernel.run("%%rlm --wasm -c data -o _res\nRead it")
    listener.settimeout(0.2)
    with pytest.raises(TimeoutError):  # nothing connected from the sandbox (deno_net)
        listener.accept()
    assert rlm_kernel.value("_res.final_answer, _res.sandbox") == ("8 parts read", "wasm")
    assert len(server.requests_for(SUB)) == 8
    outputs = rlm_kernel.value("[r.output for it in _res.trajectory for r in it.code]")
    assert outputs[0].startswith("8 echo: part 0")
    reached = __import__("json").loads(outputs[1].strip().splitlines()[-1])
    assert reached["own_file"] == "FileNotFoundError"  # Pyodide's files are its own
    assert reached["deno_read"] == "JsException"  # NotCapable: no read permission
    assert reached["deno_env"] == "JsException"
    assert reached["deno_run"] == "JsException"
    assert reached["granted"] == []  # Deno holds no permission once Pyodide has loaded
    assert not [name for name in reached["environ"] if "KEY" in name or "TOKEN" in name]
    isolation = rlm_kernel.value("{k: v for k, v in _res.isolation.items() if k != 'notes'}")
    assert isolation == dict.fromkeys(
        ("webassembly", "filesystem", "network", "environment", "processes", "memory"), True
    )
    assert _no_deno_left(rlm_kernel) == 0


@pytest.mark.parametrize(
    "backend, label, code",
    [
        pytest.param("wasm", "w1: %%rlm --wasm, sleeping step", "time.sleep(30)", marks=needs_wasm),
        pytest.param(
            "wasm", "w2: %%rlm --wasm, busy step", "while True:\n    pass", marks=needs_wasm
        ),
        pytest.param(
            "container",
            "c1: %%rlm in a container, busy step",
            "while True:\n    pass",
            marks=needs_container,
        ),
    ],
)
def test_an_interrupt_stops_a_sandboxed_step_at_once(rlm_kernel, server, backend, label, code):
    server.script(ROOT, [f"```repl\nimport time\nprint(llm_query('started'))\n{code}\n```"])
    rlm_kernel.run(f"data = 'some context'\n%config RLM.sandbox = {backend!r}")

    usage = interrupt_and_check(
        rlm_kernel,
        server,
        label,
        "%%rlm -c data\nWhat is in the data?",
        into_the_step_after_its_sub_call(server),
        ready_timeout=60,  # the first start may fetch Pyodide
    )
    rlm_kernel.run("%config RLM.sandbox = 'auto'")
    assert usage["calls"] == 2, usage
    assert rlm_kernel.value("_rlm.sandbox, _rlm.stop_reason") == (backend, "interrupted")
    assert _no_deno_left(rlm_kernel) == 0
