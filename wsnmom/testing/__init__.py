"""Test support shipped with wsnmom: the adapter conformance kit (a pytest plugin)."""
