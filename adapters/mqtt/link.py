"""One paho-mqtt client and its connection: settings applied, connected in the background with
reconnects (exponential backoff), state visible without I/O (:attr:`Link.reason`: why it is
not connected, in words).

:class:`Link` runs its client on the adapter's :class:`~.driver.Driver` (one thread does
all the socket I/O; with ``own_loop`` it calls ``after_read`` on every pass and the users
wake it, otherwise queueing a packet wakes it), never on paho's ``loop_start``, whose
``select`` refuses descriptors >= 1024: it connects, reads, writes, sends keep-alives and
reconnects after a loss, waiting ``reconnect_min_delay`` doubled up to
``reconnect_max_delay`` between attempts.  (Cluster mode's subscription sessions use no
paho client: :mod:`.sub_client`.) Its callbacks never block: the
users of a link only record what happened and hand work to their own threads.
:meth:`Link.start` waits for the first CONNACK and turns a refusal into the adapter's typed
errors (wrong credentials, not authorized) so a gateway does not keep knocking.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

try:
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError('the MQTT adapter needs paho-mqtt: pip install "wsnmom[mqtt]"') from exc

from wsnmom.core.adapter import (
    AccessRefused,
    AdapterError,
    AdapterUnavailable,
    CredentialsRefused,
)

from .config import MqttSettings
from .driver import Driver

__all__ = ["Link", "PacketTypes", "Properties", "ReasonCode", "mqtt", "refusal"]

log = logging.getLogger("wsnmom.adapters.mqtt")

#: CONNACK reason codes that mean "these credentials are wrong" / "not allowed".  "Not
#: authorized" (0x87; 5 in MQTT 3.1.1) counts as wrong credentials: it is what Mosquitto
#: answers to a wrong password, and at CONNECT the credentials are all a client offers.
_BAD_CREDENTIALS = {0x86, 0x87, 0x8C}  # bad user name or password, not authorized, bad method
_NOT_AUTHORIZED = {0x8A}  # banned
_BAD_CLIENT = {0x85, 0x84}  # client identifier not valid, unsupported protocol version

#: paho's logger; the adapter logs connection changes itself
_PAHO_LOG = logging.getLogger("paho.mqtt.client")


class _NotConnectedNoise(logging.Filter):
    """paho logs "Client is not connected" at ERROR whenever its network loop runs once
    more after a disconnect, which is every orderly shutdown."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Client is not connected")


_PAHO_LOG.addFilter(_NotConnectedNoise())

OnConnected = Callable[[bool, Any], None]
OnDisconnected = Callable[[], None]


class Link:
    """A paho client on the adapter's broker (see the module docstring).

    ``persistent``: the session survives the connection (clean start false, MQTT 5
    session expiry ``settings.session_expiry``); otherwise every connection starts clean.
    ``on_connected(session_present, properties)`` and ``on_disconnected()`` are called on
    the driver's network thread, after the link's own state
    changed.  ``after_read`` (``own_loop`` only) is called after every read, under
    ``io_lock``.  ``reconnect`` false: a lost connection stays lost.
    """

    def __init__(
        self,
        settings: MqttSettings,
        client_id: str,
        *,
        persistent: bool,
        manual_ack: bool = False,
        on_connected: OnConnected | None = None,
        on_disconnected: OnDisconnected | None = None,
        label: str = "link",
        own_loop: bool = False,
        after_read: Callable[[], None] | None = None,
        reconnect: bool = True,
        receive_maximum: int | None = None,
    ) -> None:
        self.settings = settings
        #: the Receive Maximum this link's CONNECT announces (None: the settings')
        self.receive_maximum = receive_maximum
        self.label = label
        self.persistent = persistent
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._cv = threading.Condition()
        self._connected = False
        #: connections made so far (a CONNACK with success each)
        self.connections = 0
        #: whether the broker still had the session at the last connection
        self.session_present = False
        #: the refusal of the last CONNACK, None after a success
        self._refused: AdapterError | None = None
        #: what the last connection attempt met, and why the last connection ended
        #: ("" while connected, or before it happened)
        self._attempt = ""
        self._lost = ""
        self._started = False
        client = _new_client(settings, client_id, persistent, manual_ack, reconnect)
        client.on_socket_open = _no_delay
        client.on_connect = self._connect_cb
        client.on_connect_fail = self._connect_fail_cb
        client.on_disconnect = self._disconnect_cb
        self.client = client
        # never paho's ``loop_start``: its ``select`` refuses descriptors >= 1024
        self.driver = Driver(
            client,
            label.replace(" ", "-").lower(),
            settings.reconnect_min_delay,
            settings.reconnect_max_delay,
            on_connect_fail=self._connect_failed,
            after_read=after_read,
            wake_on_queue=not own_loop,
            reconnect=reconnect,
        )
        #: held around calls into the client from other threads that queue packets
        #: (the driver's thread holds it while it reads and writes); with
        #: ``own_loop`` call ``wake()`` after queueing, without it queueing wakes the
        #: driver and paho's own locks suffice
        self.io_lock: Any = self.driver.io_lock

    # -- state ------------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """Whether the link is connected now (no I/O)."""
        return self._connected

    @property
    def reason(self) -> str:
        """Why the link is not connected ("" when it is; no I/O): what its last attempt
        met (refused, a CONNACK's refusal) and, after a loss, why the connection ended."""
        if self._connected:
            return ""
        where = f"the MQTT broker {self.settings.host}:{self.settings.port}"
        now, lost = self._attempt, self._lost
        if not now and not lost:
            return f"not connected to {where} yet"
        if now and lost:
            return f"{now} (before that, {lost})"
        return now or f"{where}: {lost}"

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, timeout: float) -> None:
        """Connect (in the background) and wait for the first CONNACK.

        AdapterUnavailable when the broker does not answer within ``timeout`` (the link is
        stopped: call ``start`` on a new link to try again); CredentialsRefused /
        AccessRefused / AdapterError when it refuses the connection."""
        s = self.settings
        props: Properties | None = None
        if s.v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = s.session_expiry if self.persistent else 0
            props.ReceiveMaximum = self.receive_maximum or s.receive_maximum
        clean: Any = not self.persistent if s.v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY
        before = self.connections
        self.client.connect_async(
            s.host, s.port, keepalive=s.keepalive, clean_start=clean, properties=props
        )
        self._started = True
        self.driver.start()
        with self._cv:
            # a CONNACK counts even when the connection is gone again by the time this
            # thread looks (a take-over of a fixed client id right after it connected);
            # a ``stop`` from another thread meanwhile ends the wait too
            self._cv.wait_for(
                lambda: (
                    self._connected
                    or self._refused is not None
                    or self.connections > before
                    or not self._started
                ),
                timeout,
            )
            refused, connected = self._refused, self._connected or self.connections > before
            stopped = not self._started
        if connected:
            return
        self.stop()
        if refused is not None:
            raise refused
        if stopped:
            raise AdapterUnavailable(f"{self.label}: stopped while waiting for the CONNACK")
        raise AdapterUnavailable(
            f"the MQTT broker {s.host}:{s.port} did not accept a connection within {timeout:g}s"
        )

    def stop(self) -> None:
        """Disconnect and end the network thread; idempotent."""
        if not self._started:
            return
        with self._cv:
            self._started = False
            self._cv.notify_all()
        self.driver.stop()
        with self._cv:
            self._connected = False
            self._cv.notify_all()

    def wake(self) -> None:
        """Have the network thread write what was queued and call ``after_read``
        (needed with ``own_loop``; otherwise queueing a packet wakes the driver)."""
        self.driver.wake()

    # -- paho callbacks (network thread) ---------------------------------------------------
    def _connect_cb(
        self, client: Any, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        if reason.is_failure:
            refused = refusal(reason.value, str(reason), self.settings)
            with self._cv:
                self._refused = refused
                self._attempt = str(refused)
                self._cv.notify_all()
            if isinstance(refused, AdapterUnavailable):
                log.warning("%s: the broker refused the connection: %s", self.label, reason)
            else:
                # waiting would not help: stop knocking (the adapter reports the error)
                log.error("%s: %s", self.label, refused)
                self.driver.give_up = True
                client.disconnect()
            return
        if self.settings.v5 and properties is not None:
            receive_max = getattr(properties, "ReceiveMaximum", None)
            if receive_max and int(receive_max) < client.max_inflight_messages:
                log.warning(
                    "%s: the broker accepts %s unacknowledged messages, fewer than the "
                    "client sends (%d): it may close the connection",
                    self.label,
                    receive_max,
                    client.max_inflight_messages,
                )
        if self.connections:
            log.info("%s: reconnected to the MQTT broker", self.label)
        with self._cv:
            self._connected = True
            self._refused = None
            self._attempt = self._lost = ""
            self.connections += 1
            self.session_present = bool(flags.session_present)
            self._cv.notify_all()
        if self._on_connected is not None:
            self._on_connected(bool(flags.session_present), properties)

    def _connect_failed(self, exc: OSError) -> None:
        why = exc.strerror or str(exc) or type(exc).__name__
        if isinstance(exc, ConnectionRefusedError):
            why = "connection refused"
        elif isinstance(exc, TimeoutError):
            why = "no answer in time"
        s = self.settings
        self._attempt = f"cannot connect to the MQTT broker {s.host}:{s.port}: {why}"
        self._connect_fail_cb(self.client, None)

    def _connect_fail_cb(self, client: Any, userdata: Any) -> None:
        # nothing listens (or no route): the first ``start`` fails at once instead of
        # waiting out its timeout; later, paho keeps retrying with backoff
        if self.connections == 0:
            s = self.settings
            with self._cv:
                self._refused = AdapterUnavailable(
                    self._attempt or f"cannot connect to the MQTT broker {s.host}:{s.port}"
                )
                self._cv.notify_all()

    def _disconnect_cb(
        self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any
    ) -> None:
        with self._cv:
            was = self._connected
            self._connected = False
            if was:
                self._attempt, self._lost = "", _lost(flags, reason)
            self._cv.notify_all()
        if was and self._started:
            log.warning("%s: connection to the MQTT broker lost (%s)", self.label, reason)
        if self._on_disconnected is not None:
            self._on_disconnected()


def _lost(flags: Any, reason: Any) -> str:
    """Why a connection ended, from paho's disconnect callback: the broker's DISCONNECT
    reason, a keep-alive missed, or the connection lost."""
    name = str(reason)
    if getattr(flags, "is_disconnect_packet_from_server", False):
        return f"the broker closed the connection ({name})"
    if name == "Keep alive timeout":
        return "keep-alive missed: the broker did not answer in time"
    return "the connection was lost"


def _no_delay(client: Any, userdata: Any, sock: Any) -> None:
    """Send small packets (PUBACKs, SUBSCRIBEs) at once: without TCP_NODELAY they can wait
    for the peer's delayed ACK (40 ms on Linux) behind earlier unacknowledged data."""
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def refusal(code: int, name: str, settings: MqttSettings) -> AdapterError:
    """The adapter error for a CONNACK refusing with reason ``code`` (named ``name``)."""
    where = f"{settings.host}:{settings.port}"
    if code in _BAD_CREDENTIALS:
        return CredentialsRefused(
            f"the MQTT broker {where} refused the gateway's login ({name}; MQTT takes the "
            "user name and password from the URL or the adapter options username / "
            "password, a client certificate from certfile / keyfile)"
        )
    if code in _NOT_AUTHORIZED:
        return AccessRefused(f"the MQTT broker {where} does not authorize the gateway ({name})")
    if code in _BAD_CLIENT:
        return AdapterError(f"the MQTT broker {where} refused the client ({name})")
    return AdapterUnavailable(f"the MQTT broker {where} refused the connection ({name})")


def _new_client(
    settings: MqttSettings, client_id: str, persistent: bool, manual_ack: bool, reconnect: bool
) -> mqtt.Client:
    """A paho client with the settings applied (protocol, credentials, TLS, reconnect
    delays); its callbacks are the link's to set."""
    protocol = mqtt.MQTTv5 if settings.v5 else mqtt.MQTTv311
    kwargs: dict[str, Any] = {
        "callback_api_version": CallbackAPIVersion.VERSION2,
        "client_id": client_id,
        "protocol": protocol,
        "manual_ack": manual_ack,
        # False: a lost connection stays lost (cluster mode's subscription sessions
        # decide themselves whether to connect again, :mod:`.cluster_handle`)
        "reconnect_on_failure": reconnect,
    }
    if not settings.v5:
        kwargs["clean_session"] = not persistent
    client = mqtt.Client(**kwargs)
    client.suppress_exceptions = True  # a bug in a callback must not end the network loop
    client.enable_logger(_PAHO_LOG)
    client.connect_timeout = settings.connect_timeout
    client.reconnect_delay_set(
        settings.reconnect_min_delay,  # type: ignore[arg-type]
        settings.reconnect_max_delay,  # type: ignore[arg-type]
    )
    if settings.username is not None:
        client.username_pw_set(settings.username, settings.password)
    if settings.tls:
        client.tls_set(
            ca_certs=settings.ca_certs,
            certfile=settings.certfile,
            keyfile=settings.keyfile,
            cert_reqs=ssl.CERT_REQUIRED,
        )
        if settings.tls_insecure:
            client.tls_insecure_set(True)
    return client
