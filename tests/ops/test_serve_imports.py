"""``wsnmom serve`` on the embedded adapter imports no other adapter's client library, no
PostgreSQL driver and no HTTP client library it does not use: the built-in plugins name
their adapter classes and import them when a URL's scheme is resolved, the PostgreSQL store
and coordination are imported for a ``postgresql://`` store only, and the WS-N client
(requests) when an upstream is subscribed to.  A real start: a ``sitecustomize`` module
on the gateway's ``PYTHONPATH`` writes the names in ``sys.modules`` when the process exits
(after ``/readyz`` answered and SIGTERM stopped it).  ``-X importtime`` would not do: it
does not see modules imported through ``importlib.import_module``, which is how plugins
and adapters are loaded.  docs/performance.md, "Process start"."""

from __future__ import annotations

from pathlib import Path

from .serve_process import free_port, running_serve, serve_env

#: top-level packages a gateway on the embedded adapter must not import
NOT_ON_EMBEDDED = (
    "pika",
    "kafka",
    "confluent_kafka",
    "paho",
    "psycopg",
    "psycopg_pool",
    "pyspark",
    "elementpath",
    "requests",
)

#: the module that records them
SITECUSTOMIZE = """\
import atexit, sys

def _write():
    with open({out!r}, "w") as f:
        f.write("\\n".join(sorted(sys.modules)))

atexit.register(_write)
"""


def test_serve_on_embedded_imports_only_what_it_uses(tmp_path: Path) -> None:
    site, out = tmp_path / "site", tmp_path / "modules.txt"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(out=str(out)))
    env = serve_env(tmp_path, PYTHONPATH=str(site))
    with running_serve(["--data-dir", str(tmp_path / "data")], env, free_port()) as process:
        pass
    assert process.returncode == 0, process.stdout.read() if process.stdout else ""
    modules = out.read_text().split()
    assert "wsnmom.adapters.embedded.adapter" in modules  # the list is the gateway's
    assert [m for m in modules if m.split(".")[0] in NOT_ON_EMBEDDED] == []
