"""Logs, metrics and probes: usable by every adapter and by the engine."""
