"""The one helper that keeps secrets out of logs, banners, faults and documents."""

from __future__ import annotations

import pytest
from wsnmom.core.redaction import redact_config, redact_text, redact_url


@pytest.mark.parametrize(
    ("shown", "hidden"),
    [
        ("amqp://wsn:s3cret@rabbit:5672/%2F", "amqp://wsn:***@rabbit:5672/%2F"),
        ("kafka://k:9092?sasl.password=s3cret&x=%2F", "kafka://k:9092?sasl.password=***&x=%2F"),
        ("http://h/c?access_token=s3cret", "http://h/c?access_token=***"),
        ("embedded:///var/lib/wsnmom", "embedded:///var/lib/wsnmom"),
        ("mqtts://u@h:8883", "mqtts://u@h:8883"),
        # a password whose /, ?, # or @ was not percent-encoded: urlsplit ends the
        # authority inside it; the user part is taken up to the last @ instead
        ("postgresql://u:ab/cd@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:p@ss/w:rd%?#x@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:a?b@h/db?sslpassword=s", "postgresql://u:***@h/db?sslpassword=***"),
        ("http://h:8080/x?mail=a@b", "http://h:8080/x?mail=a@b"),
    ],
)
def test_redact_url(shown: str, hidden: str) -> None:
    assert redact_url(shown) == hidden


def test_redact_text_and_config() -> None:
    text = (
        "cannot connect to amqp://wsn:s3cret@h:5672/ ({'sasl.password': 's3cret'}); "
        "ssl.key.password=s3cret, api_key: s3cret"
    )
    assert "s3cret" not in redact_text(text)
    assert redact_text("at http://h:8080/wsn/broker 12:00:01") == (
        "at http://h:8080/wsn/broker 12:00:01"
    )
    assert redact_config({"sasl.password": "x", "ssl.ca.location": "/ca"}) == {
        "sasl.password": "***",
        "ssl.ca.location": "/ca",
    }
