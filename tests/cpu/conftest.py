"""The native CPU kernel tests share helpers beside this file (gguf_reference.py): importlib mode puts
no test directory on sys.path by itself."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
