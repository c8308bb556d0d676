#!/usr/bin/env bash
# Type-checks core/, topic_mapping/, the log adapters, wsnmom/client/, wsnmom/shell/ and the
# gateway test support (wsnmom.testing.gateway/.middleware) as packages of wsnmom.
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
for d in core topic_mapping soap_frontend; do [[ -d $d ]] && ln -s "../../$d" "$root/$d"; done
ln -s ../../../adapters/__init__.py "$root/adapters/__init__.py"
for d in adapters/*/; do d=${d%/}; ln -s "../../../$d" "$root/$d"; done
MYPYPATH=.typecheck exec "${MYPY:-.venv/bin/mypy}" -p wsnmom.core -p wsnmom.topic_mapping \
  -p wsnmom.adapters.logbase -p wsnmom.adapters.filelog -p wsnmom.adapters.kafka -p wsnmom.client -p wsnmom.shell \
  -m wsnmom.testing.gateway -m wsnmom.testing.middleware "$@"
