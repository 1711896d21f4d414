import os
import sys

# Pretends to be the worker's own control-flow exception.
sys.stdout.write('{"ok": false, "error": {"code": "AbortedStaleTask", "message": "fake"}}')
sys.stdout.flush()
os._exit(1)
