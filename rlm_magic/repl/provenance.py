"""Where an answer came from, told by running the reply again with the data changed.

A model that writes its answer in the same reply as code whose output it has not seen
may have typed that answer before it could know it (``FINAL(7)`` after
``print(len(lines))``), or may have computed it (``FINAL(len(lines))``). No reading of
the code's spelling tells the two apart for every way Python can write a value, so the
question is put to the value itself: **an answer is typed when it comes out the same
with every piece of data replaced**. The reply's blocks run again (``replay``) in a
counterfactual namespace, once per world below, where

- the contexts and every variable of the model's are changed into other values of the
  same type, each when the code first reads it (text with its letters and digits
  shifted; text doubled; numbers moved; containers changed item by item, and
  lengthened in the second world),
- ``llm_query`` and the other helpers answer at once, locally, with text no real model
  would give (or a value of a typed call's schema); a real helper call is refused,
- the model's functions see the counterfactual namespace as their globals, with their
  defaults and closures copied,
- nothing acts outside the process: ``open`` and the modules that do (``os``,
  ``subprocess``, sockets, ...) are refused to the model's code, and an audit hook
  refuses their events to any module while a replay runs; objects that cannot be
  copied safely (a DataFrame, an instance of the model's own class) raise on any use.

The namespace notes whether the code read data (a name holding data read before the
reply wrote it). Each world's answer goes back to the kernel as a digest
(``answer_digest``), and the kernel decides (``rlm.finishing.origin``): a digest that
differs from the real answer's means the answer depends on data (computed), and the
worlds stop there; the same digest in every world means it was typed; a world that
could not run to the same kind of finish (an error, a refused object, its time up)
decides nothing.

Its limits, stated in the security guide: an answer drawn from a clock counts as
computed; code blocked in C is not stopped before it returns; a replay costs about the
reply's own CPU for a computed answer and three times it for a typed one (sub-calls
excepted), within the time the run gives it.

Standard library only: the sandbox worker imports this.

Why one module: the worlds, the lazy copying of what code reads and the guard on what a
replay may do are one replay: each world is only as sound as the copying and the guard
that run with it, so they are read and changed together.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextvars
import functools
import hashlib
import inspect
import io
import random
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .capture import OutputSink, captured_into
from .finishers import Finish, answer_dict_finish, final_var, finisher_functions
from .helpers import BATCH_NAMES, HELPER_NAMES
from .namespace import ASYNC_TABLE, FINISHERS, PRINT_FINAL

# Replayed blocks are compiled under this name (never a step's: the interrupt handler
# and the tracebacks read those).
REPLAY_FILENAME = "<rlm-replay>"

# Values a replay copies at most (items of containers, counted once each), and characters
# of text: past either, the world decides nothing rather than cost the process more.
_MOST_ITEMS = 2_000_000
_MOST_CHARS = 256 * 2**20


class Undecidable(Exception):
    """A world that cannot stand in for the real one (a value it may not copy)."""


def answer_digest(how: str, text: str) -> str:
    """What a finish is compared by, in the kernel and in the REPL alike."""
    return hashlib.sha256(f"{how}\0{text}".encode("utf-8", "surrogatepass")).hexdigest()


def carried_digests(namespace: dict[str, Any], carried: dict[str, Any]) -> dict[str, str | None]:
    """The variables that still hold what an earlier question left (``carried``: name ->
    the object it left), each with the digest its text answers by (None for a value
    other than text or a number: containers are not written out to compare)."""
    held: dict[str, str | None] = {}
    for name, value in carried.items():
        if namespace.get(name, _GONE) is not value:
            continue  # this question set it again (or deleted it)
        plain = isinstance(value, (str, int, float)) and not isinstance(value, bool)
        text = value if isinstance(value, str) else str(value)
        held[name] = answer_digest("variable", text) if plain else None
    return held


_GONE = object()


def assigned_names(code: str) -> set[str]:
    """The names a block binds, deletes or declares global: a carried variable among
    them is this question's now, whatever its value (``found = True`` again is the
    same object as the ``True`` an earlier question left)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.Global):
            names.update(node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


# -- the worlds ----------------------------------------------------------------------------
# Letters and digits one up, the last staying: not a permutation, so even what a set of
# them gives (its least member, how many kinds) moves.
_SHIFTED = str.maketrans(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    "bcdefghijklmnopqrstuvwxyzzBCDEFGHIJKLMNOPQRSTUVWXYZZ1234567899",
)


class World:
    """One counterfactual: how it changes text, numbers and containers, and what its
    sub-models answer."""

    def __init__(self, name: str, text: Callable[[str], str], number: Callable[[Any], Any]):
        self.name, self.text, self.number = name, text, number
        self.longer = name == "doubled"  # lengthen sequences, as it doubles text
        self.answers = 0

    def answer(self, prompt: Any, schema: Any = None) -> Any:
        """A sub-model's answer in this world: never one a real model gives; for a
        typed call (a JSON schema), a value of the schema's shape."""
        self.answers += 1
        text = f"\u27e6{self.name} answer {self.answers} to {str(prompt)[:40]!r}\u27e7"
        return text if schema is None else self.instance(schema, text, depth=0)

    def instance(self, schema: Any, text: str, depth: int) -> Any:
        """A value of a JSON schema's shape, its leaves this world's (a rough one: for
        the model's code to run on, never to be validated)."""
        if not isinstance(schema, dict) or depth > 8:
            return text
        for choice in ("anyOf", "oneOf", "allOf"):
            if isinstance(schema.get(choice), list) and schema[choice]:
                return self.instance(schema[choice][0], text, depth + 1)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][-1 if self.longer else 0]
        kind = schema.get("type")
        kind = kind[0] if isinstance(kind, list) and kind else kind
        if kind == "object":
            properties = schema.get("properties")
            fields = properties if isinstance(properties, dict) else {}
            return {str(k): self.instance(v, text, depth + 1) for k, v in list(fields.items())[:50]}
        if kind == "array":
            item = self.instance(schema.get("items"), text, depth + 1)
            return [item, item] if self.longer else [item]
        if kind in ("integer", "number"):
            return self.number(1000 + self.answers)
        if kind == "boolean":
            return self.longer
        if kind == "null":
            return None
        return text


def worlds() -> list[World]:
    """The worlds a reply is replayed in, the likelier to move a computed answer first:
    the first keeps the data's shape (JSON, CSV and line counts parse as before, every
    value differs); the second doubles text and lengthens lists (every count moves)."""
    return [
        World("shifted", lambda text: text.translate(_SHIFTED), lambda n: n + 1),
        World("doubled", lambda text: f"{text}\n{text}", lambda n: n * 2 + 3),
    ]


class _Opaque:
    """Stands in for a value a world cannot change safely: any use of it undecides."""

    __slots__ = ("_what",)

    def __init__(self, what: str):
        object.__setattr__(self, "_what", what)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise Undecidable(f"a {object.__getattribute__(self, '_what')} is not replayed")

    def __getattribute__(self, name: str) -> Any:
        raise Undecidable(f"a {object.__getattribute__(self, '_what')} is not replayed")

    __call__ = __getitem__ = __setitem__ = __iter__ = __len__ = __contains__ = _refuse
    __str__ = __repr__ = __format__ = __bool__ = __eq__ = __hash__ = __lt__ = _refuse
    __add__ = __radd__ = __mul__ = __sub__ = __truediv__ = __int__ = __float__ = _refuse
    __enter__ = __exit__ = __index__ = __setattr__ = __delattr__ = _refuse


# Values of these types are shared with the real namespace: they cannot change.
_SHARED = (
    types.ModuleType,
    types.BuiltinFunctionType,
    type(None),
    type(Ellipsis),
    range,
    slice,
)


class _Copier:
    """The world's version of every value of the namespace, each made once (shared and
    cyclic structures stay so)."""

    def __init__(self, world: World, real: dict[str, Any], replayed: dict[str, Any]):
        self.world, self.real, self.replayed = world, real, replayed
        self.made: dict[int, Any] = {}
        self.items = self.chars = 0

    def __call__(self, value: Any) -> Any:
        key = id(value)
        if key in self.made:
            return self.made[key]
        self.items += 1
        if self.items > _MOST_ITEMS:
            raise Undecidable("too many values to replay")
        made = self._changed(value)
        self.made[key] = made
        return made

    def _changed(self, value: Any) -> Any:
        world = self.world
        if isinstance(value, types.ModuleType) and value.__name__.partition(".")[0] in (
            _ACTS_OUTSIDE
        ):
            return _Opaque(f"module {value.__name__}")  # what it does is not undone
        if isinstance(value, types.BuiltinMethodType) and not isinstance(
            getattr(value, "__self__", None), types.ModuleType
        ):
            return _Opaque("bound method")  # results.append: it would change the real list
        if isinstance(value, bool) or isinstance(value, _SHARED):
            return value
        if isinstance(value, str):
            self.chars += len(value)
            if self.chars > _MOST_CHARS:
                raise Undecidable("too much text to replay")
            return world.text(value)  # a str subclass's own constructor may want more
        if isinstance(value, bytes):
            return world.text(value.decode("latin-1")).encode("latin-1")
        if isinstance(value, (int, float, complex)):
            return world.number(value)
        if isinstance(value, types.FunctionType):
            return self._function(value)
        if isinstance(value, type):
            # A class of the model's own: its methods read the real namespace.
            return _Opaque("class") if value.__module__ == self.real.get("__name__") else value
        if type(value) in (list, tuple, set, frozenset):
            return self._sequence(value)
        if isinstance(value, dict):
            return self._mapping(value)
        return _Opaque(type(value).__name__)

    def _sequence(self, value: Any) -> Any:
        if isinstance(value, list):
            made: list[Any] = []
            self.made[id(value)] = made  # a list that holds itself
            made.extend(self(item) for item in value)
        else:
            made = [self(item) for item in value]
        if self.world.longer and made:
            made.append(made[0] if not isinstance(value, (set, frozenset)) else self._other(made))
        return made if isinstance(value, list) else type(value)(made)

    def _other(self, made: list[Any]) -> Any:
        first = made[0]
        return self.world.text(first) if isinstance(first, str) else _Opaque("item")

    def _mapping(self, value: dict[Any, Any]) -> dict[Any, Any]:
        try:
            made = value.copy()  # its own type: Counter, OrderedDict, defaultdict
        except Exception:  # noqa: BLE001 - a dict subclass of the model's own
            raise Undecidable("a mapping that cannot be copied") from None
        if type(made) is not type(value):
            raise Undecidable("a mapping that cannot be copied")
        self.made[id(value)] = made
        for key, item in value.items():
            made[key] = self(item)
        return made

    def _function(self, function: types.FunctionType) -> Any:
        if function.__globals__ is not self.real:
            return function  # imported: it reads its own module, not the data
        # Its defaults and closure cells are data too, and the replay must not change
        # the real ones (``def add(x, seen=[])``, a closure over a list).
        defaults = function.__defaults__
        cells = function.__closure__
        made = types.FunctionType(
            function.__code__,
            self.replayed,
            function.__name__,
            None if defaults is None else tuple(self(value) for value in defaults),
            None if cells is None else tuple(self._cell(cell) for cell in cells),
        )
        kwdefaults = function.__kwdefaults__
        made.__kwdefaults__ = (
            None if kwdefaults is None else {k: self(v) for k, v in kwdefaults.items()}
        )
        made.__qualname__ = function.__qualname__
        return made

    def _cell(self, cell: types.CellType) -> types.CellType:
        try:
            return types.CellType(self(cell.cell_contents))
        except ValueError:  # an empty cell (a name assigned later)
            return types.CellType()


class _Watched(dict[str, Any]):
    """A replay's namespace. It notes whether the reply's code read data: a name holding
    data (a context, a variable from before the reply, a helper's answer) read before
    the reply wrote it. And it makes the world's copy of a value only when the code
    first reads it, so a replay costs what the reply reads, not the whole namespace
    (a 100 MB context the reply never touched is not copied). Code at a block's top
    level and in its functions reads and writes its globals through these methods when
    they are not a plain dict."""

    def __init__(self, data: set[str], pending: dict[str, Callable[[], Any]]):
        super().__init__()
        self.data, self.written, self.read_data = data, set[str](), False
        self.pending = pending  # name -> makes the world's copy of its value

    def __getitem__(self, name: str) -> Any:
        if name in self.data and name not in self.written:
            self.read_data = True
        try:
            return super().__getitem__(name)
        except KeyError:
            if name not in self.pending:
                raise
        made = self.pending.pop(name)()
        super().__setitem__(name, made)
        return made

    def __setitem__(self, name: str, value: Any) -> None:
        self.written.add(name)
        self.pending.pop(name, None)
        super().__setitem__(name, value)

    def __delitem__(self, name: str) -> None:
        self.written.add(name)
        if self.pending.pop(name, None) is None:
            super().__delitem__(name)

    def __contains__(self, name: object) -> bool:
        return name in self.pending or super().__contains__(name)

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def made_whole(self) -> _Watched:
        """Every value copied now (for code that reads the namespace as a whole)."""
        for name in list(self.pending):
            self[name]
        return self

    def __iter__(self) -> Any:
        return super(_Watched, self.made_whole()).__iter__()

    def __len__(self) -> int:
        return super(_Watched, self.made_whole()).__len__()

    def keys(self) -> Any:
        return super(_Watched, self.made_whole()).keys()

    def items(self) -> Any:
        return super(_Watched, self.made_whole()).items()

    def values(self) -> Any:
        return super(_Watched, self.made_whole()).values()


# What the namespace holds that is not data: the protocol and the preloaded modules.
_NOT_DATA = {"__name__", "__builtins__", "answer", "asyncio", "re", "json", *FINISHERS, PRINT_FINAL}


def _is_data(name: str, value: Any) -> bool:
    if name in _NOT_DATA:
        return False
    return not isinstance(value, (types.ModuleType, types.FunctionType, type, *_SHARED))


def _refused_open(*args: Any, **kwargs: Any) -> Any:
    raise Undecidable("files are not opened in a replay")


# Whether this thread (or one a replay started) is replaying: while it is, the audit
# hook below refuses every action outside the process, whichever module asks (pandas'
# to_csv opens its file with the real open; asyncio starts processes): the import guard
# only covers the model's own code.
_replaying: contextvars.ContextVar[bool] = contextvars.ContextVar("rlm_replaying", default=False)
_OUTSIDE_EVENTS = ("open", "os.", "subprocess.", "socket.", "shutil.", "ctypes.", "pty.")
_INSIDE_EVENTS = {"os.listdir", "os.scandir"}  # reading a folder's names changes nothing
_hooked = False


def _refuse_outside(event: str, args: tuple[Any, ...]) -> None:
    if _replaying.get() and event.startswith(_OUTSIDE_EVENTS):
        if event not in _INSIDE_EVENTS:
            raise Undecidable(f"a replay does not act outside the process ({event})")


def _hook_once() -> None:
    """An audit hook stays for the process's life; it is added at the first replay and
    costs one attribute read per audited event."""
    global _hooked
    if not _hooked:
        sys.addaudithook(_refuse_outside)
        _hooked = True


# Modules whose use acts outside the process (files, processes, the network, signals):
# a replay never imports or uses them, so code that does is not run twice (in the
# kernel's own threads, with RLM.sandbox = "none", that would touch the user's files).
_ACTS_OUTSIDE = frozenset(
    {
        "os", "posix", "nt", "subprocess", "shutil", "pathlib", "tempfile", "glob",
        "socket", "ssl", "select", "selectors", "urllib", "http", "ftplib", "smtplib",
        "requests", "httpx", "aiohttp", "websockets", "webbrowser", "ctypes", "signal",
        "multiprocessing", "sqlite3", "builtins", "io", "_io", "fcntl", "mmap", "pty",
        "resource", "sys",
    }
)  # fmt: skip
# Of those, what a replay may still use: in-memory text and bytes buffers.
_IN_MEMORY = {"io": types.SimpleNamespace(StringIO=io.StringIO, BytesIO=io.BytesIO)}


def _replay_import(real_import: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        top = name.partition(".")[0]
        if level == 0 and top in _IN_MEMORY and name == top:
            return _IN_MEMORY[top]  # io.StringIO, never io.open
        if level == 0 and top in _ACTS_OUTSIDE:
            raise Undecidable(f"a replay does not import {top}")
        return real_import(name, globals, locals, fromlist, level)

    return guarded


def replayed_namespace(real: dict[str, Any], world: World, finish: Finish) -> _Watched:
    """The counterfactual of ``real``: its data changed (each value as the code first
    reads it), its helpers answered locally."""
    data = {name for name, value in real.items() if _is_data(name, value)}
    pending: dict[str, Callable[[], Any]] = {}
    replayed = _Watched(data | set(HELPER_NAMES) | {ASYNC_TABLE}, pending)
    dict.__setitem__(replayed, "__name__", real.get("__name__", "__rlm__"))
    table = dict(real.get("__builtins__") or vars(builtins))
    table["open"] = _refused_open
    table["__import__"] = _replay_import(table.get("__import__", builtins.__import__))
    dict.__setitem__(replayed, "__builtins__", table)
    copy = _Copier(world, real, replayed)
    for name, value in real.items():
        if name in replayed or name in HELPER_NAMES or name in FINISHERS:
            continue
        if name in (ASYNC_TABLE, PRINT_FINAL):
            continue
        if name == "answer" and isinstance(value, dict):
            # Its content is data; whether it is ready is the protocol's, kept as it is.
            pending[name] = functools.partial(_answer_copy, copy, value)
        else:
            pending[name] = functools.partial(copy, value)
    dict.update(replayed, finisher_functions(replayed, finish))
    dict.update(replayed, _local_helpers(world))
    return replayed


def _answer_copy(copy: _Copier, answer: dict[str, Any]) -> dict[str, Any]:
    return {**copy(answer), "ready": answer.get("ready")}


def _schema(response_format: Any) -> Any:
    """The JSON schema a typed call asks for, as model code passes it (a dict, or
    OpenAI's ``{"type": "json_schema", "json_schema": {"schema": ...}}``)."""
    if not isinstance(response_format, dict):
        return None
    wrapped = response_format.get("json_schema")
    if isinstance(wrapped, dict) and isinstance(wrapped.get("schema"), dict):
        return wrapped["schema"]
    return response_format


def _local_helpers(world: World) -> dict[str, Any]:
    def blocking(name: str) -> Callable[..., Any]:
        batch = name in BATCH_NAMES

        def helper(prompts: Any = None, *args: Any, **kwargs: Any) -> Any:
            schema = _schema(kwargs.get("response_format"))
            if batch:
                return [world.answer(prompt, schema) for prompt in list(prompts or ())]
            return world.answer(prompts, schema)

        helper.__name__ = name
        return helper

    def awaitable(call: Callable[..., Any]) -> Callable[..., Any]:
        async def helper(*args: Any, **kwargs: Any) -> Any:
            return call(*args, **kwargs)

        return helper

    table = {name: blocking(name) for name in HELPER_NAMES}
    return {**table, ASYNC_TABLE: {name: awaitable(call) for name, call in table.items()}}


# -- the replay ----------------------------------------------------------------------------
@dataclass
class Replayed:
    """What a replay found: per world, the digest of its answer, or None where the world
    could not run to one; and whether the reply's code read data (None: not known)."""

    digests: list[str | None] = field(default_factory=list)
    read_data: bool | None = None

    def as_message(self) -> dict[str, Any]:
        return {"digests": self.digests, "read_data": self.read_data}


def replay(
    codes: Sequence[str],
    real: dict[str, Any],
    helper_names: set[str],
    compile_block: Callable[[str, set[str], str], Any],
    *,
    variable: str | None = None,
    fit: Callable[[list[str] | None], list[str] | None] = lambda finish: finish,
    answer: str | None = None,
) -> Replayed:
    """Run the reply's ``codes`` again in each world: what it answers there (the finish
    of its last block, or ``variable``'s value), as a digest. ``fit``: what the REPL
    does to a finish before the kernel sees it. ``answer``: the real answer's digest, or
    None for an answer written in the reply's text; the worlds stop once they settle
    it (an answer that moved was computed; a text answer needs only whether data was
    read), so an answer computed from data costs one world, not two."""
    compiled = [compile_block(code, helper_names, REPLAY_FILENAME) for code in codes]
    _hook_once()
    token = _replaying.set(True)  # threads the replay starts inherit it (``capture``)
    state = random.getstate()  # the process's random numbers go on as if no replay ran
    try:
        return _replayed(compiled, real, variable, fit, answer)
    finally:
        random.setstate(state)
        _replaying.reset(token)


def replaying() -> bool:
    """Whether this thread is running a replay (a real helper call is refused there)."""
    return _replaying.get()


def _replayed(
    compiled: list[Any],
    real: dict[str, Any],
    variable: str | None,
    fit: Callable[[list[str] | None], list[str] | None],
    answer: str | None,
) -> Replayed:
    found = Replayed()
    for world in worlds():
        finish = Finish({})
        try:
            namespace = replayed_namespace(real, world, finish)
        except Exception:  # noqa: BLE001 - a value that cannot be changed: no world
            found.digests.append(None)
            continue
        ran = False
        try:
            found.digests.append(_answer_in(namespace, finish, compiled, variable, fit))
            ran = True
        except Exception:  # noqa: BLE001 - the data changed, so the code may fail
            found.digests.append(None)
        # Any world that read data says so; one that ran every block without, that the
        # code reads none (a world cut short by an error may not have got there).
        if namespace.read_data:
            found.read_data = True
        elif ran and found.read_data is None:
            found.read_data = False
        moved = answer is not None and found.digests[-1] not in (None, answer)
        if moved or (answer is None and found.read_data is not None):
            break
    return found


def _answer_in(
    namespace: _Watched,
    finish: Finish,
    compiled: list[Any],
    variable: str | None,
    fit: Callable[[list[str] | None], list[str] | None],
) -> str | None:
    finish.namespace = namespace
    with captured_into(OutputSink()):  # what the replay prints goes nowhere
        for code in compiled:
            finish.result = None  # the last block's finish is the one compared
            result = eval(code, namespace)  # noqa: S307 - model code, as the step ran it
            if inspect.iscoroutine(result):
                asyncio.run(result)
    if variable is not None:
        value = final_var(namespace, variable)
        return None if value is None else answer_digest("variable", value)
    done = finish.result
    if done is None:
        done, _ = answer_dict_finish(namespace)
    done = fit(done)
    return None if done is None else answer_digest(done[0], done[1])
