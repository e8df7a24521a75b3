"""Install or remove the "Python 3 (RLM)" Jupyter kernel spec.

    python -m rlm_magic.jupyter.kernelspec install   [--user | --sys-prefix | --prefix P]
                                                     [--name rlm]
    python -m rlm_magic.jupyter.kernelspec uninstall [--user | --sys-prefix | --prefix P]
                                                     [--name rlm]

With no location flag, install goes to the current environment (``sys.prefix``), like
``--sys-prefix``, so the kernel runs the Python it was installed from; argv[0] of the
spec is rewritten to this ``sys.executable`` for the same reason.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

DEFAULT_NAME = "rlm"
_SPEC_FILES = ("kernel.json", "logo-32x32.png", "logo-64x64.png")


def spec_dir() -> Path:
    """Where the spec's files are: ``kernel_spec/`` of a source checkout (also what an
    editable install sees), else a copy shipped inside the package."""
    package = Path(__file__).resolve().parent
    for candidate in (package.parent / "kernel_spec", package / "kernel_spec"):
        if (candidate / "kernel.json").is_file():
            return candidate
    raise FileNotFoundError(
        "the rlm kernel spec files (kernel_spec/kernel.json) are "
        f"missing next to or inside {package}"
    )


def _prefix_for(args: argparse.Namespace) -> str | None:
    if args.prefix:
        return os.path.abspath(str(args.prefix))
    if args.sys_prefix or not args.user:
        return sys.prefix
    return None


def install(name: str = DEFAULT_NAME, user: bool = False, prefix: str | None = None) -> str:
    """Install the spec; returns the directory it was installed to."""
    from jupyter_client.kernelspec import KernelSpecManager

    source = spec_dir()
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / name
        staged.mkdir()
        for filename in _SPEC_FILES:
            if (source / filename).is_file():
                shutil.copy(source / filename, staged / filename)
        spec = json.loads((staged / "kernel.json").read_text())
        spec["argv"][0] = sys.executable  # run the env this was installed from
        (staged / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
        return KernelSpecManager().install_kernel_spec(str(staged), name, user=user, prefix=prefix)


def uninstall(name: str = DEFAULT_NAME, user: bool = False, prefix: str | None = None) -> str:
    """Remove the spec from the given location; returns the directory removed."""
    from jupyter_core.paths import SYSTEM_JUPYTER_PATH, jupyter_data_dir

    if user:
        root = Path(jupyter_data_dir())
    elif prefix:
        root = Path(prefix) / "share" / "jupyter"
    else:
        root = Path(SYSTEM_JUPYTER_PATH[0])
    path = root / "kernels" / name
    if not (path / "kernel.json").is_file():
        raise FileNotFoundError(f"no kernel spec {name!r} at {path}")
    shutil.rmtree(path)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlm_magic.jupyter.kernelspec",
        description="Install or remove the 'Python 3 (RLM)' Jupyter kernel (rlm_magic preloaded).",
    )
    parser.add_argument("action", choices=("install", "uninstall"))
    parser.add_argument(
        "--name", default=DEFAULT_NAME, help=f"kernel spec name (default: {DEFAULT_NAME})"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="your user's Jupyter directory")
    where.add_argument(
        "--sys-prefix", action="store_true", help=f"this environment, {sys.prefix} (the default)"
    )
    where.add_argument("--prefix", metavar="P", help="the prefix P (P/share/jupyter/kernels)")
    args = parser.parse_args(argv)
    if not args.name or os.sep in args.name or (os.altsep and os.altsep in args.name):
        parser.error(f"--name must be a plain name, got {args.name!r}")
    prefix, user = _prefix_for(args), bool(args.user)
    try:
        if args.action == "install":
            path = install(args.name, user=user, prefix=prefix)
            print(
                f"Installed kernel spec {args.name!r} (Python 3 (RLM), {sys.executable}) in {path}"
            )
        else:
            path = uninstall(args.name, user=user, prefix=prefix)
            print(f"Removed kernel spec {args.name!r} from {path}")
    except PermissionError as exc:
        print(f"error: {exc} (try --user)", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
