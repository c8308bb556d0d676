"""The admin API's dead-letter endpoints (``core.dead_letters``), on the admin blueprint.

Reading::

    GET  /wsn/admin/api/dead-letters[?destination=NAME]   {"count": n, "dead_letters": [...]}
    GET  /wsn/admin/api/dead-letters/peek?count=N[&destination=NAME]
                                                          the first N, with their bodies
                                                          (the gateway holds them: reading
                                                          consumes nothing)
    GET  /wsn/admin/api/dead-letters/<id>                 one, with its body ("body" as
                                                          text, or "body_base64")

Acting (authenticated admins)::

    POST /wsn/admin/api/dead-letters/<id>/replay    {"consumer": "http://..."} optional:
                                                    to the original subscription without
    POST /wsn/admin/api/dead-letters/<id>/purge     remove one
    POST /wsn/admin/api/dead-letters/purge          remove every one held
                                                    ({"destination": NAME} optional)

Errors as the rest of the admin API: 404 unknown dead letter, 409 a replay that failed
(the consumer refused by the outbound policy or not answering; it stays a dead letter).
"""

from __future__ import annotations

import base64
from typing import Any

from flask import Response, request
from wsnmom.core import errors
from wsnmom.core.dead_letter_records import DeadLetter

from .admin_actions import _act
from .admin_api import _caller, _error, _json, _refused_reading, _service, admin_api
from .admin_reads import peek_count

__all__ = ["dead_letter_json"]


def dead_letter_json(letter: DeadLetter, *, body: bool = False) -> dict[str, Any]:
    """A dead letter as the admin API shows it (the body only with ``body``)."""
    data = letter.summary()
    if body:
        try:
            data["body"] = letter.body.decode("utf-8")
        except UnicodeDecodeError:
            data["body_base64"] = base64.b64encode(letter.body).decode("ascii")
    return data


def _unavailable(exc: errors.ResourceUnavailable) -> Response:
    retry = exc.retry_after
    headers = (("Retry-After", str(max(1, round(retry)))),) if retry else ()
    return _error(exc.description, 503, headers)


def _form() -> dict[str, Any]:
    form = request.get_json(silent=True)
    return form if isinstance(form, dict) else {}


@admin_api.get("/dead-letters")
def list_dead_letters() -> Response:
    """The dead letters the gateway holds, oldest first per destination."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    try:
        letters = _service().dead_letters(request.args.get("destination") or None)
    except errors.ResourceUnknown as exc:
        return _error(exc.description, 404)
    except errors.ResourceUnavailable as exc:
        return _unavailable(exc)
    items = [dead_letter_json(letter) for letter in letters]
    return _json({"count": len(items), "dead_letters": items})


@admin_api.get("/dead-letters/peek")
def peek_dead_letters() -> Response:
    """The first dead letters held, oldest first per destination, with their bodies."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    try:
        count = peek_count()
        letters = _service().dead_letters(request.args.get("destination") or None)
    except ValueError as exc:
        return _error(str(exc), 400)
    except errors.ResourceUnknown as exc:
        return _error(exc.description, 404)
    except errors.ResourceUnavailable as exc:
        return _unavailable(exc)
    items = [dead_letter_json(letter, body=True) for letter in letters[:count]]
    return _json(
        {"count": len(items), "held": len(letters), "complete": True, "dead_letters": items}
    )


@admin_api.get("/dead-letters/<letter_id>")
def show_dead_letter(letter_id: str) -> Response:
    """One dead letter with its body."""
    if (refused := _refused_reading(_caller())) is not None:
        return refused
    try:
        letter = _service().dead_letter(letter_id)
    except errors.ResourceUnknown:
        return _error(f"no dead letter {letter_id!r}", 404)
    except errors.ResourceUnavailable as exc:
        return _unavailable(exc)
    return _json(dead_letter_json(letter, body=True))


@admin_api.post("/dead-letters/<letter_id>/replay")
def replay_dead_letter(letter_id: str) -> Response:
    """Re-deliver a dead letter to its subscription, or to ``{"consumer": address}``."""
    consumer = _form().get("consumer") or None
    service = _service()
    return _act(
        "dead letter",
        letter_id,
        "replay",
        lambda: service.replay_dead_letter(letter_id, None if consumer is None else str(consumer)),
    )


@admin_api.post("/dead-letters/<letter_id>/purge")
def purge_dead_letter(letter_id: str) -> Response:
    """Remove one dead letter."""
    service = _service()
    return _act("dead letter", letter_id, "purge", lambda: service.purge_dead_letters([letter_id]))


@admin_api.post("/dead-letters/purge")
def purge_all_dead_letters() -> Response:
    """Remove every dead letter held (of one destination)."""
    destination = _form().get("destination") or None
    service = _service()
    name = "all" if destination is None else str(destination)
    return _act(
        "dead letters",
        name,
        "purge",
        lambda: service.purge_dead_letters(None, None if destination is None else str(destination)),
    )
