"""A fork server for mutmut's test runs (``scripts/mutation.sh``).

mutmut 2 runs its ``--runner`` command once per mutant.  A fresh pytest process spends
seconds importing pytest, lxml, prometheus-client and the parts of wsnmom a test needs,
far longer than the tests of one module take; on a shared 2-core machine a module's run
took hours.  So ``serve`` imports those once, then forks one child per mutant, which runs
``pytest.main`` and imports the mutated module fresh from disk (mutmut writes each mutant
into the file in place).  ``run`` is the runner command mutmut calls: it sends its
arguments to the server and exits with the child's status.

    python scripts/mutation_runner.py serve SOCKET wsnmom.core.channel core/channel.py
    python scripts/mutation_runner.py run SOCKET PYTEST-ARGS...

The server preloads what the module under test imports (read from its source).  It refuses
to start when preloading imported the module under test (a child would then test the
unmutated code).  A child still running when its client goes away (mutmut's
timeout killed it) is killed.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import os
import select
import signal
import socket
import sys
import tempfile


def _imports(source_path: str) -> list[str]:
    """The modules a source file imports at its top level."""
    with open(source_path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


#: pytest plugins and libraries every child would otherwise import again
COMMON = ("pytest", "_pytest.pytester", "hypothesis", "pytest_timeout", "lxml.etree")


def serve(path: str, module: str, source_path: str) -> int:
    for name in (*COMMON, *_imports(source_path)):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if module in sys.modules:
        print(f"preloading imported {module}: its mutants would not be tested", file=sys.stderr)
        return 2
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            request = json.loads(_read_line(conn))
            if request.get("stop"):
                return 0
            status = _run_child(conn, request["args"])
            with contextlib.suppress(OSError):  # the client is gone
                conn.sendall(f"{status}\n".encode())


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _run_child(conn: socket.socket, args: list[str]) -> int:
    pid = os.fork()
    if pid == 0:  # the child: run the tests against what is on disk now
        code = 1
        try:
            # never read or write cached bytecode: a __pycache__ entry written by another
            # run (its timestamp check has one-second resolution) could stand for the module
            sys.dont_write_bytecode = True
            sys.pycache_prefix = tempfile.mkdtemp(prefix="wsnmom-mutant-pyc-")
            # no entry-point plugins (hypothesis, timeout, wsnmom's...): the tests need
            # none, and discovering and loading them took most of a run's CPU time
            os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            code = int(pytest.main(args))
        finally:
            os._exit(code)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        readable, _, _ = select.select([conn], [], [], 0.05)
        if readable and not conn.recv(1, socket.MSG_PEEK):  # the client is gone
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 1


def run(path: str, args: list[str]) -> int:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    client.sendall((json.dumps({"args": args}) + "\n").encode())
    reply = _read_line(client).strip()
    # mutmut counts only exit status 1 as a killed mutant; pytest exits 2 when a mutant
    # cannot even be imported (collection error), which is killed too
    return 0 if reply == "0" else 1


def stop(path: str) -> int:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    client.sendall(b'{"stop": true}\n')
    return 0


def main(argv: list[str]) -> int:
    command, path, *rest = argv
    if command == "serve":
        module, source_path = rest
        return serve(path, module, source_path)
    if command == "run":
        return run(path, rest)
    if command == "stop":
        return stop(path)
    print(f"unknown command {command}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
