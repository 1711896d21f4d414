"""The conformance kit: the golden vectors, the reference task and the battery.

A worker of any language can be checked with it (docs/conformance.md).
"""
