"""The NCIA SubscriptionEnd notification (NCIA Annex 1, A.2/A.3).

When the broker ends a subscription itself (consumer unreachable beyond the retry policy,
a full backlog with ``limits.on_full = "end"``, administrative removal, a filter that no
longer compiles after a restart) and the subscriber gave a ``wsn-nato:SubscriptionEndTopic``,
a ``wsn-nato:SubscriptionEnd`` message is published on that topic.  Never for Unsubscribe
or expiry.
"""

from __future__ import annotations

from lxml import etree
from wsnmom.core.redaction import redact_text

__all__ = ["NATO_NS", "WSNMOM_NS", "subscription_end_payload"]

#: NCIA extension namespace (SubscriptionEnd, SubscriptionEndTopic)
NATO_NS = "http://nc3a.nato.int/ces/wsn/extension"
WSA_NS = "http://www.w3.org/2005/08/addressing"
WSNMOM_NS = "urn:wsnmom:ns:1"


def subscription_end_payload(subscription_address: str, reason: str) -> bytes:
    """The NCIA ``wsn-nato:SubscriptionEnd`` element::

    <wsn-nato:SubscriptionEnd>
      <wsn-nato:SubscriptionReference><wsa:Address>...</wsa:Address></...>
      <wsnmom:Reason>...</wsnmom:Reason>          (##other extension)
    </wsn-nato:SubscriptionEnd>
    """
    root = etree.Element(
        f"{{{NATO_NS}}}SubscriptionEnd",
        nsmap={"wsn-nato": NATO_NS, "wsa": WSA_NS, "wsnmom": WSNMOM_NS},
    )
    ref = etree.SubElement(root, f"{{{NATO_NS}}}SubscriptionReference")
    etree.SubElement(ref, f"{{{WSA_NS}}}Address").text = subscription_address
    etree.SubElement(root, f"{{{WSNMOM_NS}}}Reason").text = redact_text(reason)
    return etree.tostring(root, encoding="UTF-8")
