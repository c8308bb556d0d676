"""The XSD files the gateway ships beside its WSDL are the official OASIS files, unchanged
(two are served with a client-friendly variant applied on the way out: see
``soap_frontend/schema_variants.py`` and tests/soap_frontend/test_wsdl_interop.py)."""

from __future__ import annotations

import os

import pytest

from tests.support.wsn_schemas import OFFICIAL_SCHEMAS, schema_dir, served_schema_dir


def _official_present() -> bool:
    return (OFFICIAL_SCHEMAS / "b-2.xsd").is_file()


def test_validation_uses_the_official_schemas() -> None:
    if not _official_present():
        if os.environ.get("CI") == "true":
            pytest.fail(f"official OASIS schemas missing at {OFFICIAL_SCHEMAS}")
        pytest.skip("no ../shared/schemas/oasis beside this checkout")
    assert schema_dir() == OFFICIAL_SCHEMAS


@pytest.mark.parametrize("name", sorted(p.name for p in served_schema_dir().glob("*.xsd")), ids=str)
def test_served_copy_is_identical(name: str) -> None:
    if not _official_present():
        pytest.skip("no ../shared/schemas/oasis beside this checkout")
    assert (served_schema_dir() / name).read_bytes() == (OFFICIAL_SCHEMAS / name).read_bytes()
