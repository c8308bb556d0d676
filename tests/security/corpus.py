"""Seed requests for the fuzz suite: one envelope per WS-N / WS-RF operation in the shapes
of the specifications' examples (SOAP 1.1 and 1.2), hostile XML documents, hostile
MessageContent expressions, and, when the specifications are beside the checkout
(``../shared/specs``), the example envelopes cut out of their text as they are (line
numbers and ``...`` placeholders removed; some stay malformed, which is fine for seeds).

Every address in a seed is on loopback: the fuzz gateway only ever calls 127.0.0.0/8.
"""

from __future__ import annotations

import re
from pathlib import Path

SOAP11 = "http://schemas.xmlsoap.org/soap/envelope/"
SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
DECLS = (
    'xmlns:wsa="http://www.w3.org/2005/08/addressing" '
    'xmlns:wsnt="http://docs.oasis-open.org/wsn/b-2" '
    'xmlns:wsn-br="http://docs.oasis-open.org/wsn/br-2" '
    'xmlns:wsrf-rp="http://docs.oasis-open.org/wsrf/rp-2" '
    'xmlns:wsrf-rl="http://docs.oasis-open.org/wsrf/rl-2" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
    'xmlns:npex="http://www.example.org/NotificationProducerExample" '
    'xmlns:ncex="http://www.example.org/NotificationConsumerExample"'
)
SIMPLE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Simple"
CONCRETE = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Concrete"
FULL = "http://docs.oasis-open.org/wsn/t-1/TopicExpression/Full"
XPATH = "http://www.w3.org/TR/1999/REC-xpath-19991116"
RE = "http://exslt.org/regular-expressions"
STR = "http://exslt.org/strings"

#: operation bodies; ``{consumer}`` is a loopback consumer that answers 202
BODIES: dict[str, str] = {
    "Notify": f"""<wsnt:Notify><wsnt:NotificationMessage>
        <wsnt:SubscriptionReference><wsa:Address>http://127.0.0.1:9/SubscriptionManager</wsa:Address></wsnt:SubscriptionReference>
        <wsnt:Topic Dialect="{SIMPLE}">npex:SomeTopic</wsnt:Topic>
        <wsnt:ProducerReference><wsa:Address>http://127.0.0.1:9/NotificationProducer</wsa:Address></wsnt:ProducerReference>
        <wsnt:Message><npex:NotifyContent>exampleNotifyContent</npex:NotifyContent></wsnt:Message>
      </wsnt:NotificationMessage></wsnt:Notify>""",
    "Subscribe": f"""<wsnt:Subscribe>
        <wsnt:ConsumerReference><wsa:Address>{{consumer}}</wsa:Address></wsnt:ConsumerReference>
        <wsnt:Filter>
          <wsnt:TopicExpression Dialect="{SIMPLE}">npex:SomeTopic</wsnt:TopicExpression>
          <wsnt:MessageContent Dialect="{XPATH}">boolean(ncex:Producer="15")</wsnt:MessageContent>
        </wsnt:Filter>
        <wsnt:InitialTerminationTime>PT10M</wsnt:InitialTerminationTime>
        <wsnt:SubscriptionPolicy><wsnt:UseRaw/></wsnt:SubscriptionPolicy>
      </wsnt:Subscribe>""",
    "SubscribeFull": f"""<wsnt:Subscribe>
        <wsnt:ConsumerReference><wsa:Address>{{consumer}}</wsa:Address>
          <wsa:ReferenceParameters><ncex:Id>1</ncex:Id></wsa:ReferenceParameters>
        </wsnt:ConsumerReference>
        <wsnt:Filter>
          <wsnt:TopicExpression Dialect="{FULL}">npex:a//* | npex:b/c</wsnt:TopicExpression>
        </wsnt:Filter>
      </wsnt:Subscribe>""",
    "GetCurrentMessage": f"""<wsnt:GetCurrentMessage>
        <wsnt:Topic Dialect="{CONCRETE}">npex:SomeTopic/sub</wsnt:Topic>
      </wsnt:GetCurrentMessage>""",
    "Renew": """<wsnt:Renew>
        <wsnt:TerminationTime>2030-01-01T00:00:00Z</wsnt:TerminationTime>
      </wsnt:Renew>""",
    "Unsubscribe": "<wsnt:Unsubscribe/>",
    "PauseSubscription": "<wsnt:PauseSubscription/>",
    "ResumeSubscription": "<wsnt:ResumeSubscription/>",
    "CreatePullPoint": "<wsnt:CreatePullPoint/>",
    "GetMessages": """<wsnt:GetMessages>
        <wsnt:MaximumNumber>10</wsnt:MaximumNumber>
      </wsnt:GetMessages>""",
    "DestroyPullPoint": "<wsnt:DestroyPullPoint/>",
    "RegisterPublisher": f"""<wsn-br:RegisterPublisher>
        <wsn-br:PublisherReference><wsa:Address>http://127.0.0.1:9/PublisherEndpoint</wsa:Address></wsn-br:PublisherReference>
        <wsn-br:Topic Dialect="{SIMPLE}">npex:SomeTopic</wsn-br:Topic>
        <wsn-br:Demand>false</wsn-br:Demand>
        <wsn-br:InitialTerminationTime>PT1H</wsn-br:InitialTerminationTime>
      </wsn-br:RegisterPublisher>""",
    "DestroyRegistration": "<wsn-br:DestroyRegistration/>",
    "GetResourceProperty": """<wsrf-rp:GetResourceProperty>
        wsnt:TopicExpression</wsrf-rp:GetResourceProperty>""",
    "GetMultipleResourceProperties": """<wsrf-rp:GetMultipleResourceProperties>
        <wsrf-rp:ResourceProperty>wsnt:FixedTopicSet</wsrf-rp:ResourceProperty>
        <wsrf-rp:ResourceProperty>wsnt:TopicExpressionDialect</wsrf-rp:ResourceProperty>
      </wsrf-rp:GetMultipleResourceProperties>""",
    "GetResourcePropertyDocument": "<wsrf-rp:GetResourcePropertyDocument/>",
    "Destroy": "<wsrf-rl:Destroy/>",
}


def envelope(body: str, version: str = "1.2", to: str | None = None, headers: str = "") -> str:
    """A request envelope around ``body`` (``headers``: more header blocks)."""
    ns = SOAP12 if version == "1.2" else SOAP11
    to_header = f"<wsa:To>{to}</wsa:To>" if to else ""
    return (
        f'<s:Envelope xmlns:s="{ns}" {DECLS}><s:Header>'
        "<wsa:Action>http://docs.oasis-open.org/wsn/bw-2/x</wsa:Action>"
        f"<wsa:MessageID>urn:uuid:fuzz</wsa:MessageID>{to_header}{headers}</s:Header>"
        f"<s:Body>{body}</s:Body></s:Envelope>"
    )


#: documents every XML parser hardening is about
HOSTILE_DOCUMENTS: dict[str, bytes] = {
    "billion laughs": (
        b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
        + b"".join(
            f'<!ENTITY lol{i} "{("&lol" + (str(i - 1) if i > 1 else "") + ";") * 10}">'.encode()
            for i in range(1, 10)
        )
        + b"]><lolz>&lol9;</lolz>"
    ),
    "quadratic blowup": (
        b'<!DOCTYPE x [<!ENTITY a "' + b"a" * 50000 + b'">]><x>' + b"&a;" * 5000 + b"</x>"
    ),
    "xxe file": b'<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]><x>&e;</x>',
    "xxe parameter entity": (b'<!DOCTYPE x [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]><x/>'),
    "external dtd": b'<!DOCTYPE x SYSTEM "file:///etc/passwd"><x/>',
    "external dtd on loopback": b'<!DOCTYPE x SYSTEM "{dtd_url}"><x/>',
    "xxe on loopback": b'<!DOCTYPE x [<!ENTITY e SYSTEM "{dtd_url}">]><x>&e;</x>',
    "xinclude": (
        b'<x xmlns:xi="http://www.w3.org/2001/XInclude">'
        b'<xi:include href="file:///etc/passwd" parse="text"/></x>'
    ),
    "deep": b"<a>" * 20000 + b"</a>" * 20000,
    "wide": b"<a>" + b"<b/>" * 200000 + b"</a>",
    "many attributes": b"<a " + b" ".join(f'a{i}="1"'.encode() for i in range(20000)) + b"/>",
    "long name": b"<" + b"a" * 100000 + b"/>",
    "invalid utf-8": b"<a>\xc3\x28\xa0\xa1\xe2\x28\xa1\xf0\x90\x28\xbc</a>",
    "utf-16 mismatch": '<?xml version="1.0" encoding="UTF-8"?><a>é</a>'.encode("utf-16"),
    "nul bytes": b"<a>\x00\x00</a>",
    "unclosed cdata": b"<a><![CDATA[",
    "pi and comments": b"<?php evil ?><!-- -- --><a/>",
    "empty": b"",
    "whitespace": b"   \n\t ",
}

#: MessageContent expressions a hostile subscriber might send
HOSTILE_XPATH = [
    "re:test(string(.),'^(a+)+$')",
    "re:match(string(.), '(a|aa)+$')",
    "re:replace(string(.), '(.*)*x', 'g', 'y')",
    "str:padding(1000000000, 'x')",
    "str:concat(//*)",
    "count(//*[count(//*[count(//*) > 0]) > 0]) > 0",
    "string-length(concat(string(/),string(/),string(/),string(/),string(/),string(/))) > 0",
    "(" * 40 + "1" + ")" * 40,
    "$x",
    "document('file:///etc/passwd')",
    "unparsed-text('/etc/passwd')",
    "//*[" * 30 + "1" + "]" * 30,
    "1" + " or 1" * 2000,
    "'unterminated",
    "namespace::*",
    "//npex:NotifyContent[starts-with(., 'example')]",
]


def own_envelopes() -> list[bytes]:
    """A request envelope for every operation in :data:`BODIES`, in SOAP 1.2 and 1.1: the
    seeds that are there in every checkout."""
    return [
        envelope(body, version).encode() for body in BODIES.values() for version in ("1.2", "1.1")
    ]


def spec_envelopes(specs: Path) -> list[bytes]:
    """The example envelopes of the specifications in ``specs`` (when present)."""
    out: list[bytes] = []
    if not specs.is_dir():
        return out
    for path in sorted(specs.glob("*.txt")):
        text = path.read_text(errors="replace")
        for block in re.findall(r"<s:Envelope.*?</s:Envelope>", text, re.S):
            lines = []
            for line in block.splitlines():
                line = re.sub(r"\s+\d+\s*$", "", line)  # the specs' line numbers
                if line.strip() in ("...", ""):
                    continue
                lines.append(line)
            xml = "\n".join(lines).replace(
                "<s:Envelope ... >", f'<s:Envelope xmlns:s="{SOAP12}" {DECLS}>'
            )
            out.append(xml.replace("...", "").encode())
    return out
