"""The checkpoint tests share fixture-editing helpers in fixture_edits.py beside this file
(importlib mode puts no test directory on sys.path by itself)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
