"""Hook specifications of wsnmom: every hook a plugin can implement, in one module.

A plugin is any module or object with functions named like the hooks below and marked
with :data:`hookimpl`.  Built-in adapters are plugins too: they are loaded through the
same ``wsnmom.adapters`` entry-point group as third-party ones (see
:mod:`wsnmom.core.plugins`).  A minimal plugin module::

    from wsnmom.core.hookspecs import hookimpl

    @hookimpl
    def wsnmom_register_adapters(registry):
        registry.add("nats", "wsnmom_nats.adapter:NatsAdapter", extra=None)

declared in the plugin distribution's ``pyproject.toml``::

    [project.entry-points."wsnmom.adapters"]
    nats = "wsnmom_nats.plugin"

Implementations may accept any *subset* of a hook's arguments (pluggy passes only the
ones named), which is why adding an argument to a hook is backward compatible.  Hook
names all start with ``wsnmom_``; a marked function whose name matches no hook is an
error at load time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import click
    from wsnmom.core.adapter import Adapter, OutboundMessage, PublishReceipt
    from wsnmom.core.model import NotificationMessage
    from wsnmom.core.plugins import AdapterRegistry

#: project name shared by the markers and the plugin manager
PROJECT = "wsnmom"

#: marks a hook specification (used only in this module)
hookspec = pluggy.HookspecMarker(PROJECT)

#: marks a hook implementation in a plugin
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---------------------------------------------------------------------------------------
# Registration hooks: called once when the plugin manager is set up
# ---------------------------------------------------------------------------------------


@hookspec(historic=True)
def wsnmom_register_adapters(registry: AdapterRegistry) -> None:
    """Register adapter classes by URL scheme.

    Call ``registry.add(scheme, "package.module:ClassName", extra="name")`` once per
    scheme.  The class is given as a dotted string and imported only when a URL with that
    scheme is resolved, so registering never imports the middleware client library.

    :param registry: the :class:`~wsnmom.core.plugins.AdapterRegistry` to add to.

    The hook is *historic*: a plugin registered after start-up (a test plugin, say) is
    still called with the registry.

    .. versionadded:: 0.1
    """


@hookspec
def wsnmom_register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``wsnmom`` command line.

    :param cli: the root ``click.Group``; use ``cli.add_command(...)`` or
        ``@cli.command()``.

    .. versionadded:: 0.1
    """


# ---------------------------------------------------------------------------------------
# Application and lifecycle hooks
# ---------------------------------------------------------------------------------------


@hookspec
def wsnmom_configure_app(app: Any, service: Any) -> None:
    """Customise the Flask application after the built-in blueprints are registered.

    Use it to add blueprints, ``before_request`` handlers (authentication), WSGI
    middleware or error handlers.

    :param app: the ``flask.Flask`` application.
    :param service: the ``wsnmom.core.service.BrokerService`` behind it.

    .. versionadded:: 0.1
    """


@hookspec
def wsnmom_startup(runtime: Any) -> None:
    """The broker has started: the adapter is open and subscriptions are restored.

    Start background work here (threads, connections).  Exceptions abort the start.

    :param runtime: the running broker's runtime object (service, adapter, settings).

    .. versionadded:: 0.1
    """


@hookspec
def wsnmom_shutdown(runtime: Any) -> None:
    """The broker is stopping; called before the adapter is closed.

    Stop what ``wsnmom_startup`` started.  Exceptions are logged, not raised.

    :param runtime: the same object ``wsnmom_startup`` received.

    .. versionadded:: 0.1
    """


@hookspec
def wsnmom_adapter_opened(adapter: Adapter) -> None:
    """An adapter was opened by the broker (after ``Adapter.open`` returned).

    :param adapter: the open adapter instance.

    .. versionadded:: 0.1
    """


# ---------------------------------------------------------------------------------------
# Observer hooks: called on the hot path, must be quick and must not raise
# ---------------------------------------------------------------------------------------


@hookspec
def wsnmom_notification_published(
    message: NotificationMessage | OutboundMessage, receipt: PublishReceipt | None
) -> None:
    """A notification was confirmed by the middleware (metrics, audit).

    :param message: the published notification.
    :param receipt: the middleware's answer, when the caller has it.

    .. note:: Observers run on the publishing thread: enqueue, don't block.

    .. versionadded:: 0.1
    """


@hookspec
def wsnmom_notification_delivered(message: NotificationMessage, subscription_id: str) -> None:
    """A notification reached a consumer (push answered 2xx, or GetMessages returned it).

    :param message: the delivered notification.
    :param subscription_id: id of the subscription or pull point it was delivered for.

    .. versionadded:: 0.1
    """


@hookspec
def wsnmom_delivery_failed(
    message: NotificationMessage, subscription_id: str, error: BaseException
) -> None:
    """A push delivery attempt failed (the retry policy decides what happens next).

    :param message: the notification that could not be delivered.
    :param subscription_id: id of the subscription.
    :param error: the exception that made the attempt fail.

    .. versionadded:: 0.1
    """
