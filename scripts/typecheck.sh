#!/usr/bin/env bash
# Type-checks the whole import package wsnmom (core, topic_mapping, soap_frontend, every
# adapter, the Spark bridge, the CLI and start-up, the clients and the test support) with
# strict mypy, then the test suite's helpers, fixtures and conftests (tests/support,
# tests/fixtures), and the SOAP frontend tests' fake broker against the port it stands in for.
# mypy cannot follow setuptools' editable-install finder for the package-dir mapping, so the
# import package is laid out as a tree of symlinks under .typecheck/ first.
set -euo pipefail
cd "$(dirname "$0")/.."
root=.typecheck/wsnmom
rm -rf .typecheck && mkdir -p "$root/adapters"
for f in wsnmom/*.py; do ln -s "../../$f" "$root/$(basename "$f")"; done
ln -s ../../wsnmom/testing "$root/testing"
ln -s ../../wsnmom/client "$root/client"
ln -s ../../wsnmom/shell "$root/shell"
for d in core topic_mapping soap_frontend spark_bridge; do [[ -d $d ]] && ln -s "../../$d" "$root/$d"; done
for f in adapters/*.py; do ln -s "../../../$f" "$root/$f"; done
for d in adapters/*/; do d=${d%/}; ln -s "../../../$d" "$root/$d"; done
# every package of the distribution: core, topic_mapping, soap_frontend, the adapters, the
# CLI and start-up, the clients and the test support
MYPYPATH=.typecheck "${MYPY:-.venv/bin/mypy}" -p wsnmom "$@"
# the test suite's own support: its helpers, fixtures and conftests
mapfile -t conftests < <(find tests -name conftest.py | sort)
MYPYPATH=.typecheck "${MYPY:-.venv/bin/mypy}" tests/support tests/fixtures "${conftests[@]}" "$@"
# the frontend tests' fake broker must implement core.ports.BrokerPort like BrokerService
MYPYPATH=.typecheck exec "${MYPY:-.venv/bin/mypy}" tests/soap_frontend/fake_service.py "$@"
