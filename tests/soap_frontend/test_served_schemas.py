"""The XSD files the gateway ships beside its WSDL are the official OASIS files, unchanged
(two are served with a client-friendly variant applied on the way out: see
``soap_frontend/schema_variants.py`` and tests/soap_frontend/test_wsdl_interop.py), and the
test suite validates against these shipped copies.

The official files are pinned by their SHA-256 digests, taken from the files as OASIS (and,
for ``ws-addr.xsd`` and ``xml.xsd``, W3C) publish them: a copy edited by hand fails here, in
every checkout, with nothing else beside it."""

from __future__ import annotations

import hashlib

import pytest

from tests.support.wsn_schemas import schema_dir, served_schema_dir

#: SHA-256 of each published schema file, as downloaded from docs.oasis-open.org / w3.org
PUBLISHED = {
    "b-2.xsd": "686563563884b211afbbf2d24e28073b6618138a7e04c164306e4d004fae1634",
    "bf-2.xsd": "f5a95adc860b722e6fa0e6b4e3226347487132cd4e23a4fb80c991f2441a223b",
    "br-2.xsd": "f96dc203e9e2af0727127c584fb036c433f8c2c3f29c83e5ff69ff10ac4324d8",
    "r-2.xsd": "e6f9eea6851990d712460b20cd93c988266a8fe13ec27337cc509d532d721616",
    "rp-2.xsd": "60a6df6429f94e7456f5d2f7ce92f2607c4dba4ded57d157d1eae981a17f30b8",
    "t-1.xsd": "ad5db0432a3885d1c8a574ba6b4058193af29bc971232c4bb6b31f8295fe3329",
    "ws-addr.xsd": "af806cc9af2514e9b0b07efe4e4dc42a32dad8ac08473dc025136207779d5ee9",
    "xml.xsd": "61960fb3131e38022caad5360e2f33a3382578ab3c80cd58bd74320ede61b20c",
}


def test_validation_uses_the_shipped_schemas() -> None:
    assert schema_dir() == served_schema_dir()


def test_every_shipped_schema_is_pinned() -> None:
    assert sorted(p.name for p in served_schema_dir().glob("*.xsd")) == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED), ids=str)
def test_shipped_copy_is_the_published_file(name: str) -> None:
    digest = hashlib.sha256((served_schema_dir() / name).read_bytes()).hexdigest()
    assert digest == PUBLISHED[name], f"{name} differs from the published file"
