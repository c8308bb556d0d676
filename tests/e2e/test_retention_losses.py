"""Messages the middleware deleted by retention before a paused subscription read them are
reported, never skipped silently: the subscription's ``wsnmom:MessagesLost`` resource
property counts them and the gateway logs a warning naming the subscription.

Runs on the file-log adapter (``retention`` = records kept per stream), which shares the
cursor engine (``adapters/logbase``) with the Kafka adapter; Kafka's own retention cannot
be triggered on tansu (no retention deletion, no DeleteRecords), see
tests/adapters/test_kafka.py for the Kafka adapter against a cluster that can."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import Wsn
from tests.fixtures.server import ConsumerServer, RunningServer
from tests.support.soap import NS, WSNMOM
from tests.support.waiting import wait_until

pytestmark = pytest.mark.e2e


def messages_lost(wsn: Wsn, address: str) -> int:
    body = (
        f'<wsrf-rp:GetResourceProperty xmlns:wsnmom="{WSNMOM}">wsnmom:MessagesLost'
        "</wsrf-rp:GetResourceProperty>"
    )
    answer = wsn.post(address, body, validate=False).ok(validate=False)
    return int(answer.findtext(f"{{{WSNMOM}}}MessagesLost") or -1)


def test_retention_losses_of_a_paused_subscription_are_counted_and_logged(
    consumer: ConsumerServer,
) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="wsnmom-retention-"))
    url = f"filelog://{data_dir / 'log'}?partitions=1&retention=5"
    server = RunningServer("filelog", url, data_dir)
    server.start()
    try:
        wsn = Wsn(server, f"urn:test:{uuid.uuid4().hex[:8]}")
        sub = wsn.subscribe(consumer.address("/kept"), "tns:retained")
        wsn.post(sub.address, "<wsnt:PauseSubscription/>").ok()
        for i in range(12):
            wsn.notify(("tns:retained", f'<n xmlns="urn:n">{i}</n>'))
        assert messages_lost(wsn, sub.address) == 0  # not known until the cursor reads on
        wsn.post(sub.address, "<wsnt:ResumeSubscription/>").ok()
        got = consumer.wait_for_messages(5, timeout=15)
        texts = [m.findtext("wsnt:Message/{urn:n}n", namespaces=NS) for m in got]
        assert texts == ["7", "8", "9", "10", "11"]  # the five the log still holds
        wait_until(lambda: messages_lost(wsn, sub.address) == 7, timeout=5, what="MessagesLost 7")
        log = server.log_tail(400)
        assert f"subscription {sub.id}" in log or "were deleted by retention" in log, log
        assert "7 message(s)" in log and "deleted by retention" in log, log
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
