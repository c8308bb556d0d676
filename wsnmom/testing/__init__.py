"""Test support shipped with wsnmom.

* :mod:`wsnmom.testing.gateway`: a real gateway in a subprocess for the tests of
  applications that talk WS-N (``start_gateway``; the pytest plugin's ``wsnmom_gateway``
  fixture); :mod:`wsnmom.testing.middleware` provides its middleware.  See docs/testing.md.
* :mod:`wsnmom.testing.conformance`: the adapter conformance kit (a pytest plugin):
  ``from wsnmom.testing.conformance import AdapterConformance`` and subclass it.
"""
