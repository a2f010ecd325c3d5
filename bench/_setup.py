"""Make the project importable from bench/ scripts (policy code needs no Django)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
sys.path.insert(0, str(ROOT))
