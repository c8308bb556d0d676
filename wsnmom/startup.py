"""Why ``wsnmom serve`` could not start: one line naming the cause and what to do, and a
distinct exit status per kind of cause (docs/operations.md lists them).

:func:`explain` turns an exception raised while starting into a :class:`StartupError`;
:func:`open_listeners` binds the HTTP sockets first, so a busy port is reported before
the middleware is touched.  The middleware cases are kept apart on purpose:
:attr:`ExitStatus.MIDDLEWARE_UNREACHABLE` (connection refused, no route, name not found,
timeout) is transient and is the case a gateway may later keep running through, while
refused credentials and refused access (virtual host, permissions) always need an
operator.
"""

from __future__ import annotations

import enum
import errno
import re
import socket
import sqlite3

from wsnmom.core.adapter import (
    AccessRefused,
    AdapterError,
    AdapterUnavailable,
    CredentialsRefused,
    DirectoryInUse,
)
from wsnmom.core.config import ConfigError
from wsnmom.core.config_values import InvalidValue
from wsnmom.core.coordination import InstanceRefused
from wsnmom.core.plugins import UnknownAdapterScheme
from wsnmom.core.store import StoreError, StoreUnavailable
from wsnmom.core.store_binding import StoreOfAnotherAdapter
from wsnmom.core.store_migration import MigrationUnfinished
from wsnmom.core.store_sqlite import SqliteTooOld
from wsnmom.data_lock import DataDirInUse

__all__ = ["ExitStatus", "StartupError", "explain", "middleware_failure", "open_listeners"]


class ExitStatus(enum.IntEnum):
    """Exit statuses of ``wsnmom serve`` (stable; documented in docs/operations.md)."""

    #: stopped by SIGTERM / SIGINT after a normal start
    OK = 0
    #: an unexpected error (a bug): the traceback is shown with ``--debug``
    INTERNAL = 1
    #: the command line is malformed (click's usage errors)
    USAGE = 2
    #: a setting has an unusable value
    CONFIG = 3
    #: the configuration file cannot be read or is not valid TOML
    CONFIG_FILE = 4
    #: no adapter for the URL's scheme, or its client library is not installed
    ADAPTER = 5
    #: the listen port is in use or needs privileges
    PORT = 6
    #: the listen host does not resolve or is not an address of this machine
    HOST = 7
    #: the data directory is used by another gateway, or cannot be written
    DATA_DIR = 8
    #: the middleware cannot be reached (refused, no route, unknown host, timeout)
    MIDDLEWARE_UNREACHABLE = 9
    #: the middleware refused the credentials
    MIDDLEWARE_CREDENTIALS = 10
    #: the middleware refused access (unknown virtual host, no permission)
    MIDDLEWARE_ACCESS = 11


class StartupError(Exception):
    """A start-up failure with its exit status; ``str()`` is the one-line message."""

    def __init__(self, status: ExitStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# --------------------------------------------------------------------------------------------
# listening
# --------------------------------------------------------------------------------------------


def open_listeners(host: str, port: int) -> list[socket.socket]:
    """Bound TCP sockets for ``host:port`` (every address the host resolves to, like
    waitress), ready for ``waitress.create_server(sockets=...)``.

    :raises StartupError: ``PORT`` (in use, not permitted) or ``HOST`` (unresolvable, not
        local).
    """
    where = f"{_show_host(host)}:{port}"
    try:
        infos = socket.getaddrinfo(
            host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, socket.IPPROTO_TCP, socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise StartupError(
            ExitStatus.HOST,
            f"cannot listen on {where}: host {host!r} does not resolve ({_reason(exc)}); "
            "set --host / WSNMOM_HOST to an address of this machine (0.0.0.0 for all)",
        ) from exc
    sockets: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise _listen_error(exc, host, where) from exc
    return sockets


def _listen_error(exc: OSError, host: str, where: str) -> StartupError:
    if exc.errno == errno.EADDRINUSE:
        return StartupError(
            ExitStatus.PORT,
            f"cannot listen on {where}: the address is already in use (another wsnmom or "
            "another program listens there); stop it or choose another --port / WSNMOM_PORT",
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return StartupError(
            ExitStatus.PORT,
            f"cannot listen on {where}: permission denied (ports below 1024 need "
            "privileges); choose a port from 1024 up with --port / WSNMOM_PORT",
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return StartupError(
            ExitStatus.HOST,
            f"cannot listen on {where}: {host} is not an address of this machine; set "
            "--host / WSNMOM_HOST to one of its addresses (0.0.0.0 for all)",
        )
    return StartupError(ExitStatus.HOST, f"cannot listen on {where}: {_reason(exc)}")


def _show_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# --------------------------------------------------------------------------------------------
# classification
# --------------------------------------------------------------------------------------------

#: AMQP 0-9-1 connection.close replies (the reply code and text the broker sends)
_AMQP_LOGIN_REFUSED = re.compile(r"\(403\).*login was refused|ACCESS_REFUSED - Login", re.I)
_AMQP_ACCESS_REFUSED = re.compile(r"\((?:403|530)\)|NOT_ALLOWED|ACCESS_REFUSED", re.I)


def middleware_failure(exc: BaseException) -> ExitStatus | None:
    """Which middleware failure ``exc`` is, or None when it is not one.

    Adapters that raise :class:`~wsnmom.core.adapter.CredentialsRefused` /
    :class:`~wsnmom.core.adapter.AccessRefused` are classified by type; for the others the
    broker's reply in the message decides (AMQP reply 403 with "Login was refused" =
    credentials, other 403 and 530 = access).  Any other :class:`AdapterUnavailable` is
    "unreachable"; other adapter errors are not middleware failures (None).
    """
    if isinstance(exc, CredentialsRefused):
        return ExitStatus.MIDDLEWARE_CREDENTIALS
    if isinstance(exc, AccessRefused):
        return ExitStatus.MIDDLEWARE_ACCESS
    if not isinstance(exc, AdapterError):
        return None
    text = str(exc)
    if _AMQP_LOGIN_REFUSED.search(text):
        return ExitStatus.MIDDLEWARE_CREDENTIALS
    if _AMQP_ACCESS_REFUSED.search(text):
        return ExitStatus.MIDDLEWARE_ACCESS
    if isinstance(exc, AdapterUnavailable):
        return ExitStatus.MIDDLEWARE_UNREACHABLE
    return None


#: what to do, per middleware failure
_MIDDLEWARE_ADVICE = {
    ExitStatus.MIDDLEWARE_UNREACHABLE: (
        "check that it runs and that host and port in --adapter / WSNMOM_ADAPTER_URL are right"
    ),
    ExitStatus.MIDDLEWARE_CREDENTIALS: (
        "check the user name and password in --adapter / WSNMOM_ADAPTER_URL"
    ),
    ExitStatus.MIDDLEWARE_ACCESS: (
        "check that the virtual host in the adapter URL exists and that the user may use it"
    ),
}

#: the embedded adapter's message when its database cannot be opened
_CANNOT_OPEN = "cannot open embedded store"


def explain(exc: BaseException) -> StartupError:
    """The :class:`StartupError` for an exception raised while starting the gateway."""
    if isinstance(exc, StartupError):
        return exc
    if isinstance(exc, ConfigError):
        from wsnmom.core.config import ConfigFileError

        if isinstance(exc, ConfigFileError):
            return StartupError(ExitStatus.CONFIG_FILE, f"{exc}; fix or point --config elsewhere")
        return StartupError(ExitStatus.CONFIG, f"configuration: {exc}")
    if isinstance(exc, InvalidValue):
        return StartupError(ExitStatus.CONFIG, f"configuration: {exc}")
    if isinstance(exc, DataDirInUse):
        return StartupError(
            ExitStatus.DATA_DIR,
            f"{exc}; stop it, or give this gateway its own --data-dir / WSNMOM_DATA_DIR",
        )
    if isinstance(exc, UnknownAdapterScheme):
        return StartupError(
            ExitStatus.ADAPTER,
            f"{exc}; `wsnmom adapters` lists the installed adapters",
        )
    if isinstance(exc, ImportError):
        return StartupError(ExitStatus.ADAPTER, f"cannot load the adapter: {exc}")
    if isinstance(exc, AdapterError):
        return _adapter_error(exc)
    if isinstance(exc, InstanceRefused):
        return StartupError(ExitStatus.DATA_DIR, str(exc))
    if isinstance(exc, StoreOfAnotherAdapter):
        return StartupError(
            ExitStatus.DATA_DIR,
            f"{exc}; start this gateway with its own --data-dir / --store (or serve the "
            f"old store with --adapter of {exc.recorded!r} until its backlog is delivered); "
            "`wsnmom store migrate` copies the records of a stopped gateway to another store",
        )
    if isinstance(exc, MigrationUnfinished):  # its message names the way out
        return StartupError(ExitStatus.DATA_DIR, str(exc))
    if isinstance(exc, SqliteTooOld):
        return StartupError(ExitStatus.CONFIG, f"configuration: {exc}")
    if isinstance(exc, StoreUnavailable):
        return StartupError(
            ExitStatus.DATA_DIR,
            f"{exc.description}; check that the store's server runs and that host, port, "
            "user and password in --store / WSNMOM_STORE_URL are right",
        )
    if isinstance(exc, StoreError | sqlite3.Error):
        return StartupError(
            ExitStatus.DATA_DIR,
            f"cannot open the store: {exc}; check data_dir / store_url and its permissions",
        )
    if isinstance(exc, OSError) and exc.filename:  # creating the data directory or a file
        return StartupError(
            ExitStatus.DATA_DIR,
            f"cannot create or write {exc.filename}: {_reason(exc)}; "
            "set --data-dir / WSNMOM_DATA_DIR to a writable directory",
        )
    return StartupError(
        ExitStatus.INTERNAL,
        f"unexpected error: {type(exc).__name__}: {exc} (run with --debug for the traceback)",
    )


def _adapter_error(exc: AdapterError) -> StartupError:
    text = str(exc)
    if isinstance(exc, DirectoryInUse):
        return StartupError(
            ExitStatus.DATA_DIR,
            f"{text}: another gateway uses this data directory; stop it or give this one "
            "its own --data-dir / WSNMOM_DATA_DIR",
        )
    if _CANNOT_OPEN in text:
        return StartupError(
            ExitStatus.DATA_DIR, f"{text}; check the directory of the embedded:// URL"
        )
    status = middleware_failure(exc)
    if status is None:
        return StartupError(ExitStatus.MIDDLEWARE_UNREACHABLE, f"middleware: {text}")
    # the adapter keeps trying in the background, but this process is about to exit
    text = text.removesuffix(" (still trying)")
    return StartupError(status, f"{text}; {_MIDDLEWARE_ADVICE[status]}")
