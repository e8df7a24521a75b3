"""Execute a notebook headless with nbclient and save an executed copy.

    python scripts/run_notebook.py notebooks/01_quickstart.ipynb [--out PATH] [--kernel rlm]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--out", type=Path, help="where to write the executed copy "
                        "(default: NAME.executed.ipynb next to the notebook)")
    parser.add_argument("--kernel", help="kernel name (default: the notebook's own)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = parser.parse_args()

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.read(args.notebook, as_version=4)
    out = args.out or args.notebook.with_suffix(".executed.ipynb")
    client = NotebookClient(notebook, timeout=args.timeout,
                            kernel_name=args.kernel or notebook.metadata.kernelspec.name,
                            resources={"metadata": {"path": str(args.notebook.parent)}})
    started = time.perf_counter()
    try:
        client.execute()
    except CellExecutionError as error:
        nbformat.write(notebook, out)
        print(f"A cell failed; the partly executed notebook is at {out.resolve()}\n{error}",
              file=sys.stderr)
        return 1
    nbformat.write(notebook, out)
    print(f"Executed {args.notebook} in {time.perf_counter() - started:.1f}s.\n"
          f"Executed copy: {out.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
