"""Execute a notebook headless with nbclient and save an executed copy.

    python scripts/run_notebook.py notebooks/01_quickstart.ipynb [--out PATH] [--kernel rlm]
        [--summary]

With ``--summary`` it also prints what the cells tagged ``summary`` showed (their text
output, and Markdown where a result has it), as a short account of what the notebook did.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _kernel_manager(kernel_name: str):
    """The kernel's manager: over Unix sockets where there are some (the kernel is on
    this machine, and ipykernel warns, on every start, that TCP is unencrypted), in
    Jupyter's runtime folder; None elsewhere (nbclient's own, over TCP)."""
    if os.name != "posix":
        return None
    import uuid

    from jupyter_client.manager import KernelManager
    from jupyter_core.paths import jupyter_runtime_dir

    runtime = Path(jupyter_runtime_dir())
    runtime.mkdir(parents=True, exist_ok=True)
    connection = runtime / f"kernel-{uuid.uuid4().hex[:12]}.json"
    if len(str(connection)) > 80:  # a Unix socket's path has ~107 bytes
        return None
    return KernelManager(kernel_name=kernel_name, transport="ipc", connection_file=str(connection))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument(
        "--out",
        type=Path,
        help="where to write the executed copy "
        "(default: build/notebooks/NAME.ipynb, outside the test paths)",
    )
    parser.add_argument("--kernel", help="kernel name (default: the notebook's own)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    parser.add_argument(
        "--summary", action="store_true", help="print the output of the cells tagged 'summary'"
    )
    args = parser.parse_args()

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.read(args.notebook, as_version=4)
    # Not beside the notebook: pytest collects every notebook under notebooks/ (nbval).
    out = args.out or Path(__file__).parent.parent / "build" / "notebooks" / args.notebook.name
    out.parent.mkdir(parents=True, exist_ok=True)
    kernel_name = args.kernel or notebook.metadata.kernelspec.name
    client = NotebookClient(
        notebook,
        timeout=args.timeout,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(args.notebook.parent)}},
        km=_kernel_manager(kernel_name),
    )
    started = time.perf_counter()
    try:
        client.execute(cleanup_kc=True)  # (a manager of ours: nbclient leaves it running)
    except CellExecutionError as error:
        nbformat.write(notebook, out)
        print(
            f"A cell failed; the partly executed notebook is at {out.resolve()}\n{error}",
            file=sys.stderr,
        )
        return 1
    nbformat.write(notebook, out)
    if args.summary:
        print(summary(notebook, args.notebook.name))
    print(
        f"Executed {args.notebook} in {time.perf_counter() - started:.1f}s.\n"
        f"Executed copy: {out.resolve()}"
    )
    return 0


def summary(notebook, notebook_name: str = "the notebook") -> str:
    """The text the cells tagged 'summary' showed, each under its cell's first line."""
    blocks = []
    for cell in notebook.cells:
        if "summary" not in cell.metadata.get("tags", []):
            continue
        shown = []
        for output in cell.outputs:
            if output.output_type == "stream" and output.name == "stdout":
                shown.append(output.text.rstrip())
            elif "data" in output and "application/vnd.jupyter.widget-view+json" not in output.data:
                data = output.data
                if "text/markdown" in data:  # a result's view, read as text in a terminal
                    from rlm_magic.rlm.render import markdown_as_text

                    shown.append(markdown_as_text(str(data["text/markdown"])).strip())
                else:
                    shown.append(str(data.get("text/plain", "")).strip())
        title = cell.source.splitlines()[0] if cell.source.startswith("%") else None
        text = "\n".join(s for s in shown if s)
        blocks.append((f"{title}\n" if title else "") + _indent(text))
    return f"What {notebook_name} did:\n\n" + "\n\n".join(blocks) + "\n"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


if __name__ == "__main__":
    sys.exit(main())
