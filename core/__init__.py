"""Broker core: domain model, broker service, store, delivery, lifetimes, filters, plugin
manager and hookspecs.  Knows WS-N semantics, no middleware and no SOAP."""
