"""An operator's purge or peek of a backlog another instance of the cluster reads.

In a cluster, what waits in a pull point core buffers (Kafka, filelog) is read by one
instance, the pull point's reader, and what a push subscription's delivery took from the
middleware is held by its deliverer (``core.pull_owners``).  A purge or a peek through
another instance would see or empty only what that instance holds (a Kafka cursor it
does not read: nothing, or a stale position).  So the admin API sends such a request on
to the instance holding the resource's shard, once the admin was authorised where it
arrived (a session, a loopback operator: what only that instance knows), signed as every
forwarded request (``pull_forward``) and naming the admin for the reader's audit log;
the reader's answer is relayed as it came.  While no live instance holds the shard, or
the holder cannot be reached, or the store cannot say which pull point a subscription
feeds, the answer is 503 with ``Retry-After``.  A forwarded request is served only where
the shard still is: one arriving after the shard moved on (a hand-over during the
request) is answered 503 too, neither served (a purge of what this instance no longer
holds) nor sent on again.

Which instance: a pull point's reader; for a subscription feeding a pull point, that pull
point's reader (its feed is read with the pull point); for a push subscription, its
deliverer (on every middleware: RabbitMQ's deliverer holds the batch it is sending).
"""

from __future__ import annotations

import json
import logging

from flask import Response, current_app, request
from wsnmom.core import errors
from wsnmom.core.pull_owners import PullOwners, Reader

from .auth import FORWARDED_ADMIN_KEY
from .pull_forward import ADMIN_METHOD, PullForward, identity_value

__all__ = ["EXTENSION", "elsewhere"]

log = logging.getLogger("wsnmom.soap.admin_forward")

#: the app extension holding the application's :class:`~.pull_forward.PullForward`
EXTENSION = "wsnmom.pull_forward"


def _reader(readers: PullOwners, kind: str, resource_id: str) -> tuple[str, Reader] | None:
    """The resource whose shard decides, and who holds it; None: served here.

    :raises errors.ResourceUnavailable: no live instance holds it, or the store cannot
        say which pull point the subscription feeds (retry later)
    """
    if kind == "pull point":
        return (resource_id, readers.reader(resource_id)) if readers.active else None
    try:
        fed = readers.pull_point_fed_by(resource_id)
    except Exception as exc:  # the store: never served where the backlog may not be
        log.warning("finding the pull point subscription %s feeds failed: %s", resource_id, exc)
        raise errors.ResourceUnavailable(
            f"the store does not answer: {exc}; retry later", retry_after=readers.retry_after
        ) from exc
    if fed is not None:
        return (fed, readers.reader(fed)) if readers.active else None
    return resource_id, readers.holder(resource_id)


def elsewhere(
    kind: str, resource_id: str, admin: str, *, api_path: str | None = None, query: str = ""
) -> Response | None:
    """The holder's answer to this admin request (``kind``: "pull point" or
    "subscription"), sent on for ``admin`` (who was authorised here); None when this
    instance answers it itself.  ``api_path`` and ``query``: send a GET of that API path
    instead (the admin page's own peek)."""
    forward: PullForward | None = current_app.extensions.get(EXTENSION)
    readers = forward.readers if forward is not None else None
    environ = request.environ
    if api_path is not None:
        environ = {
            **environ,
            "REQUEST_METHOD": "GET",
            "PATH_INFO": api_path,
            "QUERY_STRING": query,
        }
    if forward is None or readers is None or not readers.clustered:
        return None
    try:
        found = _reader(readers, kind, resource_id)
        if found is None or found[1].here:
            return None
        if environ.get(FORWARDED_ADMIN_KEY) is not None:
            # sent here as the holder, which this instance no longer is (the shard moved
            # during the request): neither served here nor sent on again
            raise errors.ResourceUnavailable(
                f"the {kind} {resource_id} moved to another instance of the cluster; retry later",
                retry_after=readers.retry_after,
            )
        answer = forward.relay(
            environ,
            found[1],
            found[0],
            request.get_data() if api_path is None else b"",
            identity_value((admin, ADMIN_METHOD)),
        )
    except errors.ResourceUnavailable as exc:
        retry = max(1, round(exc.retry_after or 1.0))
        return Response(
            json.dumps({"error": exc.description}, indent=2) + "\n",
            status=503,
            mimetype="application/json",
            headers={"Retry-After": str(retry), "Cache-Control": "no-store"},
        )
    status = int(answer.status.split(" ", 1)[0])
    relayed = Response(answer.body, status=status, headers=answer.headers)
    relayed.headers["Cache-Control"] = "no-store"  # as every admin API answer
    return relayed
