"""The gateway's admin JSON API from the shell (``/wsn/admin/api/...``): what WS-N has no
operation for (listings, counts, purge).  Used by ``wsnmom subscriptions list|purge``,
``pull-points``, ``registrations``, ``topics`` and ``dead-letters``.

Credentials: the command line's (``--token``, ``--user``/``--password``), else, for a
gateway on this machine's loopback address only, the gateway's own admin token from the
environment (``WSNMOM_AUTH__ADMIN_TOKEN``, as exported for ``wsnmom serve``): it is never
sent anywhere else.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click

from .common import base_url, credentials, tls_options

if TYPE_CHECKING:
    from wsnmom.client import Credentials

__all__ = ["ADMIN_TOKEN_VARIABLE", "admin_call", "print_table", "purge_each"]

API = "/wsn/admin/api"
#: the gateway's admin token setting, read by admin commands for a loopback gateway
ADMIN_TOKEN_VARIABLE = "WSNMOM_AUTH__ADMIN_TOKEN"


def _loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _credentials(broker: str) -> Credentials | None:
    from wsnmom.client import Credentials

    given = credentials()
    if given is not None:
        if given.wsse is not None:
            raise click.UsageError("the admin API takes --user/--password or --token")
        return given
    token = os.environ.get(ADMIN_TOKEN_VARIABLE)
    if token and _loopback(broker):
        return Credentials(token=token)
    return None


def admin_call(
    method: str,
    broker: str,
    path: str,
    timeout: float,
    what: str,
    body: dict[str, Any] | None = None,
) -> Any:
    """``method`` ``/wsn/admin/api`` + ``path`` at the gateway of ``broker`` (with the JSON
    ``body``, if any); its JSON, or a one-line error naming ``what`` was asked (exit
    status 1)."""
    import requests

    url = base_url(broker) + API + path
    given = _credentials(broker)
    try:
        with requests.Session() as http:
            if given is not None:
                given.apply(http)
            tls = tls_options()
            resp = http.request(
                method, url, timeout=timeout, verify=tls["verify"], cert=tls["cert"], json=body
            )
    except requests.RequestException as exc:
        raise click.ClickException(f"cannot reach {url}: {exc}") from exc
    is_json = "json" in resp.headers.get("Content-Type", "")
    error = resp.json().get("error") if is_json and resp.status_code != 200 else None
    if resp.status_code == 401:
        raise click.ClickException(
            f"{url} asks for an admin's credentials: give --token or --user/--password"
            + (f" ({error})" if error else "")
        )
    if resp.status_code == 403:
        raise click.ClickException(
            f"{url} refused {what}: {error or 'forbidden'} (it answers admins only; "
            "without authentication, clients on the gateway's own host)"
        )
    if resp.status_code == 200 and is_json:
        return resp.json()
    if error:
        raise click.ClickException(f"{what}: {error} (HTTP {resp.status_code})")
    raise click.ClickException(
        f"{url} answered HTTP {resp.status_code}: {what} needs a wsnmom gateway (WS-N has "
        "no operation for it)"
    )


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]], noun: str) -> None:
    """Columns padded to their widest cell; ``N <noun>(s)`` on stderr."""
    cells = [[str(v) for v in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    click.echo(f"{len(rows)} {noun}(s)", err=True)


def purge_each(
    broker: str, ids: Sequence[str], collection: str, waiting: str, yes: bool, timeout: float
) -> None:
    """Drop every message waiting in each resource of ``ids`` (ids, or addresses whose
    last step is the id) through ``/<collection>/<id>/purge``, a line each; asked first
    ("drop every message waiting ``waiting``?") unless ``yes``."""
    if not yes:
        click.confirm(f"drop every message waiting {waiting}?", abort=True, err=True)
    for item in ids:
        rid = item.rstrip("/").rsplit("/", 1)[-1]
        data = admin_call("POST", broker, f"/{collection}/{rid}/purge", timeout, "the purge")
        purged = data.get("purged")
        click.echo(f"purged {rid}: {'?' if purged is None else purged} message(s) dropped")
