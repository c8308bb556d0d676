"""Test support shipped with wsnmom: the adapter conformance kit (a pytest plugin).

``from wsnmom.testing.conformance import AdapterConformance`` and subclass it; see
:mod:`wsnmom.testing.conformance`.
"""
