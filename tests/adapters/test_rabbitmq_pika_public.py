"""The RabbitMQ adapter uses only pika's public names, so pika is not pinned to a minor
release (pyproject.toml: ``pika>=1.4``).

Read from the sources (``ast``), for the adapter's package and the Spark bridge's
RabbitMQ tap (the other shipped user of pika): no import of a pika name or module that
starts with an underscore; no ``obj._name`` (nor ``getattr``/``setattr``/``hasattr``/
``delattr`` with that constant) of a private name that pika's own sources define or use
and the adapter does not define itself; and in a class derived from one of pika's, no
``self._name`` and no method ``_name`` that pika has (an access to, or an override of,
its internals), even when the adapter assigns that name itself.

The check proves it can fail: it flags the names the fast link once used
(``_on_data_available``, ``_frame_buffer``, ``_output_marshaled_frames``, ...).  And what
the adapter relies on of pika's I/O interface is there in the installed pika: the
abstract methods of ``nbio_interface`` are all implemented (an ABC refuses to
instantiate otherwise), ``AsyncioConnection`` takes the adapter's I/O services as
``custom_ioloop`` and drives its connection attempt through them.
"""

from __future__ import annotations

import ast
import asyncio
import threading
from functools import cache
from pathlib import Path

import pytest

pika = pytest.importorskip("pika")

from tests.support.ports import closed_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "adapters" / "rabbitmq"
#: the adapter's package and the other shipped module that uses pika (the Spark tap)
MODULES = [*sorted(PACKAGE.glob("*.py")), ROOT / "spark_bridge" / "rabbitmq_tap.py"]
ACCESSORS = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@cache
def pika_private() -> frozenset[str]:
    """Every private identifier pika's sources define or use (read when a test first needs
    it, not at collection, which every worker runs)."""
    names: set[str] = set()
    for path in Path(pika.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = node.name
            elif isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.alias):
                name = node.asname or node.name
            else:
                continue
            if _private(name):
                names.add(name)
    return frozenset(names)


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in {"self", "cls"}


def own_private_names(sources: list[str]) -> frozenset[str]:
    """The private names the adapter's package defines itself: its methods and
    functions, what it assigns to ``self._name``, its class and module globals."""
    names: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and _is_self(t.value):
                        names.add(t.attr)
                    elif isinstance(t, ast.Name):
                        names.add(t.id)
    return frozenset(n for n in names if _private(n))


def _pika_subclass_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes inside classes that derive from a class imported from pika."""
    from_pika: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pika":
            from_pika.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            from_pika.update(
                (a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("pika")
            )
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            roots = []
            for base in node.bases:
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name):
                    roots.append(base.id)
            if from_pika & set(roots):
                inside.update(id(n) for n in ast.walk(node))
    return inside


def violations(
    source: str, own: frozenset[str] = frozenset(), private: frozenset[str] | None = None
) -> list[str]:
    """What in ``source`` touches a private name of pika (one line each): an import of
    one; in a class derived from pika's, a ``self._name`` or ``def _name`` pika has (an
    access to or an override of its internals); elsewhere ``obj._name`` of a private name
    pika has and the adapter does not define itself (``own``), directly or through
    ``getattr``/``setattr``/``hasattr``/``delattr``."""
    if private is None:
        private = pika_private()
    tree = ast.parse(source)
    in_subclass = _pika_subclass_nodes(tree)
    foreign = private - own
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "pika":
            module = node.module or ""
            bad = [a.name for a in node.names if _private(a.name)]
            if any(_private(part) for part in module.split(".")) or bad:
                found.append(f"line {node.lineno}: from {module} import {bad or '...'}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "pika" and any(_private(p) for p in parts):
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.Attribute):
            subclass_self = id(node) in in_subclass and _is_self(node.value)
            if node.attr in (private if subclass_self else foreign):
                found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if id(node) in in_subclass and node.name in private:
                found.append(f"line {node.lineno}: def {node.name}")  # overrides pika's
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ACCESSORS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in foreign
        ):
            found.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
    return found


SOURCES = {path.name: path.read_text(encoding="utf-8") for path in MODULES}
OWN = own_private_names(list(SOURCES.values()))


def test_pikas_private_names_were_found() -> None:
    assert {"_on_data_available", "_frame_buffer", "_process_frame"} <= pika_private()
    assert {"_output_marshaled_frames", "_adapter_emit_data", "_transport"} <= pika_private()


def test_the_check_flags_what_the_fast_link_used_before() -> None:
    """The old fast link's ways into pika, each caught."""
    old = """
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport
import pika.adapters._private_module
class FastConnection(AsyncioConnection):
    def _on_data_available(self, data):
        pending = self._frame_buffer
        self._process_frame(data)
        return int(self._transport._sock.send(data))
def write(conn, data):
    conn._output_marshaled_frames([data])
    getattr(conn, "_adapter_emit_data")(data)
"""
    found = violations(old)
    assert len(found) == 9, found
    assert violations("conn.write_frames(data)\nself.readers = {}\n") == []
    # the adapter's own private names are its business, outside pika's subclasses
    mine = "class Channel:\n    def _future(self):\n        return self._future\n"
    assert violations(mine, own_private_names([mine])) == []
    # ... but inside one they would touch pika's
    assert len(violations("import pika\nclass C(pika.BaseConnection):\n" + mine[15:])) == 2


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_the_adapter_touches_no_private_name_of_pika(path: Path) -> None:
    assert violations(SOURCES[path.name], OWN) == [], path.name


def test_the_pika_io_interface_the_adapter_implements_is_complete() -> None:
    """pika's ``nbio_interface`` classes are ABCs: a new abstract method in a later pika
    makes these constructions fail here, not on a broker."""
    from pika.adapters.utils import nbio_interface
    from wsnmom.adapters.rabbitmq._fast import FrameIO, Stream

    loop = asyncio.new_event_loop()
    try:
        io = FrameIO(loop, {})
        assert isinstance(io, nbio_interface.AbstractIOServices)
        assert issubclass(Stream, nbio_interface.AbstractStreamTransport)
        assert io.get_native_ioloop() is loop
    finally:
        loop.close()


def test_pika_drives_the_connection_attempt_through_the_adapters_io(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``AsyncioConnection(custom_ioloop=<AbstractIOServices>)`` uses it: a connection to
    a closed port resolves and connects through :class:`FrameIO` and reports the refusal
    to ``on_open_error_callback``; the counters the readers add to are pika's public
    attributes."""
    from wsnmom.adapters.rabbitmq._fast import FastConnection, FrameIO

    calls: list[str] = []
    for name in ("getaddrinfo", "connect_socket"):
        method = getattr(FrameIO, name)

        def recording(self: FrameIO, *args: object, _m=method, _n=name, **kw: object) -> object:  # type: ignore[no-untyped-def]
            calls.append(_n)
            return _m(self, *args, **kw)

        monkeypatch.setattr(FrameIO, name, recording)

    loop = asyncio.new_event_loop()
    errors: list[BaseException] = []
    failed = threading.Event()

    def on_error(_conn: object, exc: BaseException) -> None:
        errors.append(exc)
        failed.set()
        loop.stop()

    try:
        with closed_port() as port:
            params = pika.ConnectionParameters(
                "127.0.0.1", port, connection_attempts=1, socket_timeout=5
            )
            conn = FastConnection(
                params,
                loop=loop,
                on_open_callback=lambda _c: loop.stop(),
                on_open_error_callback=on_error,
                on_close_callback=lambda _c, _e: None,
            )
            assert conn.ioloop is loop
            assert (conn.bytes_received, conn.frames_received) == (0, 0)
            assert (conn.bytes_sent, conn.frames_sent) == (0, 0)
            loop.call_later(10, loop.stop)
            loop.run_forever()
    finally:
        loop.close()
    assert failed.is_set(), "no open error within 10 s"
    assert isinstance(errors[0], pika.exceptions.AMQPConnectionError), errors
    assert calls == ["getaddrinfo", "connect_socket"]
