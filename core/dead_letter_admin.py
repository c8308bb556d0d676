"""What operators do with dead letters (``core.dead_letters``): list, show, replay, purge.

Replay re-delivers one dead letter and, once that succeeded, removes it:

* to its original subscription while that still exists: rendered for that subscriber and
  sent to its consumer (or into its pull point) as its own deliveries are;
* to a consumer address the operator gives: checked by the gateway's outbound policy
  (``ctx.policy``, the one used for every consumer) and sent as a wrapped Notify.

A subscription that ended (retries exhausted, filter budget) no longer exists, so its dead
letters are replayed to an address.  A failed replay leaves the dead letter where it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from wsnmom.core import errors
from wsnmom.core.adapter import AdapterError
from wsnmom.core.codec import decode, encode, pull_point_inbox
from wsnmom.core.context import BrokerContext
from wsnmom.core.dead_letter_box import DeadLetterBox
from wsnmom.core.dead_letter_records import DeadLetter, check_destination
from wsnmom.core.model import (
    Delivered,
    EndpointReference,
    NotificationMessage,
    SoapVersion,
)
from wsnmom.core.outbound_policy import AddressRefused
from wsnmom.core.ports import DeliveryFailed
from wsnmom.core.redaction import redact_url
from wsnmom.core.registry import LiveSubscription

__all__ = ["DeadLetterAdmin", "ReplayFailed"]


class ReplayFailed(errors.WsnError):
    """A dead letter could not be replayed (it stays a dead letter)."""

    fault_name = "ReplayFailedFault"
    code = "Receiver"


class DeadLetterAdmin:
    """The operators' actions on dead letters."""

    def __init__(
        self,
        ctx: BrokerContext,
        render: Callable[[LiveSubscription, NotificationMessage], NotificationMessage],
        forward: Callable[[LiveSubscription, str, Sequence[NotificationMessage]], None],
    ) -> None:
        self._ctx = ctx
        self._render = render
        self._forward = forward

    def _boxes(self, destination: str | None) -> list[DeadLetterBox]:
        letters = self._ctx.dead_letters
        try:
            if destination is None:
                return letters.boxes()
            try:
                name = check_destination(destination)
            except ValueError as exc:
                raise errors.ResourceUnknown(str(exc)) from None
            return [letters.box(name)]
        except AdapterError as exc:  # the middleware cannot open the destination now
            raise self._ctx.gate.fault(
                exc, errors.ResourceUnavailable(f"dead letters cannot be read: {exc}")
            ) from exc

    def list(self, destination: str | None = None) -> list[DeadLetter]:
        """The dead letters held, oldest first per destination."""
        return [letter for box in self._boxes(destination) for letter in box.letters()]

    def _find(self, letter_id: str) -> tuple[DeadLetterBox, DeadLetter]:
        for box in self._boxes(None):
            letter = box.get(letter_id)
            if letter is not None:
                return box, letter
        raise errors.ResourceUnknown(f"no dead letter {letter_id!r}")

    def show(self, letter_id: str) -> DeadLetter:
        """One dead letter, body included."""
        return self._find(letter_id)[1]

    def purge(self, letter_ids: Sequence[str] | None = None, destination: str | None = None) -> int:
        """Remove the given dead letters, or every one held (of ``destination``);
        how many were removed."""
        if letter_ids is not None:
            removed = 0
            for letter_id in letter_ids:
                box, _ = self._find(letter_id)
                removed += box.settle([letter_id])
            return removed
        return sum(
            box.settle([letter.id for letter in box.letters()]) for box in self._boxes(destination)
        )

    def replay(self, letter_id: str, consumer: str | None = None) -> str:
        """Re-deliver a dead letter (see the module docstring); where it went."""
        box, letter = self._find(letter_id)
        received = box.received(letter_id)
        if received is None:
            raise errors.ResourceUnknown(f"no dead letter {letter_id!r}")
        message = decode(received)
        try:
            if consumer is not None:
                where = self._to_address(message, letter.subscription_id, consumer.strip())
            else:
                where = self._to_subscription(message, letter.subscription_id)
        except DeliveryFailed as exc:
            raise ReplayFailed(f"replay of {letter_id} failed: {exc.reason}") from None
        box.settle([letter_id])
        return where

    def _to_subscription(self, message: NotificationMessage, subscription_id: str) -> str:
        ctx = self._ctx
        with ctx.registry.lock:
            state = ctx.registry.subscriptions.get(subscription_id)
            pull_point = subscription_id in ctx.registry.pull_points
        if state is None and pull_point:
            # dropped by a pull point's limits: it held the message as rendered for its
            # subscriber, so it goes back into its inbox as it is
            try:
                ctx.adapter.publish_many([encode(message, route=pull_point_inbox(subscription_id))])
            except AdapterError as exc:
                raise ReplayFailed(f"publishing into the pull point failed: {exc}") from exc
            return f"pull point {subscription_id}"
        if state is None:
            raise ReplayFailed(
                f"subscription {subscription_id} no longer exists; replay to a consumer "
                "address instead"
            )
        sub = state.record
        rendered = self._render(state, message)
        if sub.pull_point_id is not None:
            self._forward(state, sub.pull_point_id, [rendered])
            return f"subscription {sub.id}"
        ctx.outbound.notify(
            sub.consumer,
            sub.soap_version,
            [Delivered(rendered, sub.id, rendered.subscription_reference)],
            use_raw=sub.use_raw,
            timeout=ctx.settings.retry.timeout,
            wire_version=sub.wire_version,
        )
        return f"subscription {sub.id}"

    def _to_address(self, message: NotificationMessage, subscription_id: str, address: str) -> str:
        ctx = self._ctx
        shown = redact_url(address)
        if not address:
            raise ReplayFailed("a consumer address is needed")
        try:
            ctx.policy.check(address)
        except AddressRefused as exc:
            raise ReplayFailed(f"consumer address {shown!r} refused: {exc.reason}") from None
        ctx.outbound.notify(
            EndpointReference(address),
            SoapVersion.SOAP12,
            [Delivered(message, subscription_id, None)],
            use_raw=False,
            timeout=ctx.settings.retry.timeout,
        )
        return shown
