"""The conformance kit: the golden vectors, the reference task and the battery a worker of any language can be checked with (docs/conformance.md)."""
