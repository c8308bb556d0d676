"""SOAP frontend: Flask app, SOAP 1.1/1.2 envelopes, WS-Addressing, WS-N faults, WSDL and
the outbound SOAP client.

``create_app(service, settings)`` builds the WSGI application; ``SoapClient`` implements
``wsnmom.core.ports.OutboundSoap`` for pushing notifications and demand-based publishing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app
    from .client import SoapClient

__all__ = ["SoapClient", "create_app"]


def __getattr__(name: str) -> Any:
    # Lazy: importing the package must not import Flask or requests.
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "SoapClient":
        from .client import SoapClient

        return SoapClient
    raise AttributeError(name)
