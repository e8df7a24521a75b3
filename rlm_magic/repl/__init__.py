"""Running the model's code: a REPL in threads of this kernel, or in a sandbox process.

- ``base``: the ``REPL`` interface the run uses, and ``SandboxSettings``.
- ``inprocess``: ``AsyncREPL``, steps in worker threads of the kernel.
- ``sandbox``: ``SandboxREPL``, steps in a process of their own, served over the bridge.
- ``steps``: compiling and running one block (shared by both); ``rewrite``, the block's
  compile-time rewrites; ``finishers``, FINAL & co. and the scaffold kept around a
  block; ``namespace``, the names a REPL namespace holds; ``helpers``, the helper names;
  ``capture``, per-run stdout.
- ``bridge``: the sandbox's wire format; ``worker``: the sandbox process's main;
  ``fitting``: what it sends fits a frame; ``isolation``: the layers that confine it.

The worker loads this package's stdlib-only modules without running this file or
``rlm_magic/__init__.py`` (see ``worker._import_shared_code``): keep it free of code.
"""
