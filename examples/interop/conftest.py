"""The Python package's test helpers (packages/python/tests) importable here:
the interop test drives the ASGI middleware in process with the HTTP
scenarios' own `exchange`, as an ASGI server would call it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages" / "python" / "tests"))
