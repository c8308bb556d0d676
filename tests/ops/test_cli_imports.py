"""Starting the command line imports no module that only some commands need: the XPath
dialect's elementpath, the middleware client libraries, Flask, waitress and the gateway's
server and embedded adapter are imported by the commands that use them (``serve``,
``store``, ``topics translate`` with an XPath expression), not by ``wsnmom --help`` or the
shell client's commands; the WS-N client (requests, the SOAP codec, the metrics) by the
shell commands that send a request.  docs/performance.md, "Process start"."""

from __future__ import annotations

import subprocess
import sys

#: modules ``import wsnmom.cli`` must leave unimported
NOT_AT_START = (
    "elementpath",
    "pyspark",
    "pika",
    "kafka",
    "confluent_kafka",
    "paho",
    "psycopg",
    "flask",
    "waitress",
    "wsnmom.adapters.embedded.adapter",
    "wsnmom.server",
    "requests",
    "wsnmom.client.broker",
    "prometheus_client",
)


def test_importing_the_command_line_imports_no_command_only_module() -> None:
    code = (
        f"import sys, wsnmom.cli\nprint(sorted(m for m in {NOT_AT_START!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"
