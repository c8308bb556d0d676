"""Every Python block of docs/clients.md, run in order against the real gateway: the shell
and Python client examples, the zeep recipe for every operation, the ONVIF example.

The blocks share one namespace, as a reader pasting them one after the other would.  The
broker URL ``http://127.0.0.1:8080`` becomes the test gateway's, and the zeep recipe's
``CONSUMER`` a consumer endpoint of the test, so that what the recipe delivers is checked."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.server import RunningServer
from wsnmom.client import NotificationConsumer

pytestmark = pytest.mark.e2e
#: one adapter is enough: the examples are about the clients
embedded_only = pytest.mark.parametrize("wsnmom_server", ["embedded"], indirect=True)

DOC = Path(__file__).resolve().parents[2] / "docs" / "clients.md"


def _sections() -> dict[str, list[str]]:
    """Python blocks by the ``## `` section they are in."""
    out: dict[str, list[str]] = {}
    section = ""
    for part in re.split(r"^(## .*)$", DOC.read_text(), flags=re.M):
        if part.startswith("## "):
            section = part[3:].strip()
            continue
        out.setdefault(section, []).extend(re.findall(r"```python\n(.*?)```", part, re.S))
    return out


def _run(blocks: list[str], server: RunningServer, namespace: dict[str, Any]) -> str:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for block in blocks:
            code = block.replace("http://127.0.0.1:8080", server.base_url)
            exec(compile(code, str(DOC), "exec"), namespace)
    return printed.getvalue()


def test_every_section_with_code_is_run() -> None:
    sections = {name for name, blocks in _sections().items() if blocks}
    assert sections == {
        "The Python client: `wsnmom.client`",
        "zeep",
        "ONVIF event clients",
    }


@embedded_only
def test_python_client_examples(wsnmom_server: RunningServer) -> None:
    namespace: dict[str, Any] = {}
    printed = _run(_sections()["The Python client: `wsnmom.client`"], wsnmom_server, namespace)
    assert "{urn:example:sensors}building1/room1/temp b'<temp unit=\"C\">21.5</temp>'" in printed
    assert namespace["sub"].id  # the fault example subscribed again


@embedded_only
def test_zeep_recipe(wsnmom_server: RunningServer) -> None:
    with NotificationConsumer() as consumer:
        blocks = _sections()["zeep"]
        blocks[0] = re.sub(r'CONSUMER = "[^"]*"', f'CONSUMER = "{consumer.address}"', blocks[0])
        namespace: dict[str, Any] = {}
        printed = _run(blocks, wsnmom_server, namespace)
        # Subscribe + Notify: the notification passed the topic and message-content filters
        delivered = consumer.get(timeout=10)
        assert delivered.payload.text == "21.5"
        assert str(delivered.topic) == "{urn:example:sensors}room1/temp"
        assert delivered.producer_reference is not None
    assert namespace["fault_name"] == "ResourceUnknownFault"
    assert "tns:door http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple open" in printed
    assert "\nopen\n" in printed  # the current message
    assert "http://www.onvif.org/ver10/tev/topicExpression/ConcreteSet" in printed
    assert namespace["renewed"].TerminationTime > namespace["subscribed"].TerminationTime


@embedded_only
def test_onvif_example(wsnmom_server: RunningServer) -> None:
    printed = _run(_sections()["ONVIF event clients"], wsnmom_server, {})
    assert printed.strip() == (
        "{http://www.onvif.org/ver10/topics}RuleEngine/CellMotionDetector/Motion true"
    )
