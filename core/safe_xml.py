"""XML parsers for untrusted bytes: no DTD loading, no entity expansion, no network and no
file access.

libxml2 opens the external subset a document type declaration names (``<!DOCTYPE x SYSTEM
"/etc/passwd">``) even with DTD loading off: the error then differs with the file's
existence and content, and a device or a FIFO would block the parse.  Every hardened
parser therefore gets :class:`NoExternalAccess`, which answers every external
resource (DTD subset, parameter entity, entity) with an empty document, so the parser
never opens a file or a URL.
"""

from __future__ import annotations

from typing import Any

from lxml import etree

__all__ = ["NoExternalAccess", "hardened_parser"]


class NoExternalAccess(etree.Resolver):
    """Resolves every external resource to nothing."""

    # lxml calls resolve(url, public_id, context); lxml-stubs omit the context
    def resolve(self, system_url: str, public_id: str, context: Any) -> Any:  # type: ignore[override]
        return self.resolve_string("", context, base_url=None)


def hardened_parser(**options: Any) -> etree.XMLParser:
    """A parser without DTDs, entity expansion, network or file access, or huge trees;
    ``options`` are further ``XMLParser`` options (``remove_pis``, ``collect_ids``...)."""
    parser = etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        **options,
    )
    parser.resolvers.add(NoExternalAccess())
    return parser
