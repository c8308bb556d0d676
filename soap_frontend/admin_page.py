"""The admin page at ``/admin``: one HTML page, its script and its style sheet, all served
from this package (``soap_frontend/admin/``); nothing is loaded from anywhere else.

The page is served with the values of the moment filled in for a caller who may read
them (:mod:`.admin_render`: without JavaScript, or before the first refresh, it shows
values, not dashes).  Its script reads ``/wsn/admin/api/session`` (may the
browser read, is it an admin) and polls ``/wsn/admin/api/overview`` every few seconds
(``?refresh=SECONDS``, 0 stops), replacing the tables in place without reloading.  Admins
get buttons for pause, resume, unsubscribe and purge; who may read and act is decided by the
API (:mod:`.admin_api`, :mod:`.admin_auth`), never by the page.

Responses carry a Content-Security-Policy that allows only this origin's scripts, styles
and fetches and no framing (``frame-ancestors 'none'``: no clickjacking of the buttons).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from flask import Blueprint, Response

__all__ = ["ADMIN_PATH", "admin_page"]

ADMIN_PATH = "/admin"

admin_page = Blueprint("admin_page", __name__)

#: the page's files: name -> content type
_FILES = {
    "index.html": "text/html; charset=utf-8",
    "admin.js": "text/javascript; charset=utf-8",
    "admin.css": "text/css; charset=utf-8",
}
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@cache
def _file(name: str) -> bytes:
    return resources.files("wsnmom.soap_frontend").joinpath("admin", name).read_bytes()


def _serve(name: str) -> Response:
    resp = Response(_file(name), content_type=_FILES[name])
    resp.headers.update(_SECURITY_HEADERS)
    return resp


@admin_page.get(ADMIN_PATH)
def page() -> Response:
    """The admin page, with the values filled in for a caller who may read them
    (:mod:`.admin_render`)."""
    from .admin_reads import page_view
    from .admin_render import prefilled

    view = page_view()
    if view is None:
        return _serve("index.html")
    resp = Response(prefilled(_file("index.html"), *view), content_type=_FILES["index.html"])
    resp.headers.update(_SECURITY_HEADERS)
    return resp


@admin_page.get(ADMIN_PATH + "/")
def page_slash() -> Response:
    """``/admin/`` -> ``/admin`` (the page's links are relative to ``/admin``)."""
    return Response(status=308, headers={"Location": "../admin"})


@admin_page.get(ADMIN_PATH + "/<any('admin.js', 'admin.css'):name>")
def asset(name: str) -> Response:
    """The page's script and style sheet."""
    return _serve(name)
