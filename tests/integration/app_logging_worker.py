"""A worker module whose application configures the root logger itself, at import."""

from __future__ import annotations

import logging
import sys

from tests.integration.observed_workers import observed

logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="APP %(levelname)s %(message)s")

worker = observed
