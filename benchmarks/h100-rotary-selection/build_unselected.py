"""``s1omni build`` with the rotary section selection (``s1omni.export.rotary_sections``) left out: ab.py's before arm.

    python3 benchmarks/h100-rotary-selection/build_unselected.py EXPORT --backend onnxruntime ... --out ENGINE

Every other rewrite of the build is the same, so the two engines differ only in how their rotary embeddings
interleave their sections (ScatterND and friends here, Gather and Where with the selection).
"""

import sys

from s1omni.cli.main import entry
from s1omni.export import build

build.select_rotary_sections = lambda graph: 0  # the rewrite's count of chains replaced

if __name__ == "__main__":
    sys.argv = ["s1omni", "build", *sys.argv[1:]]
    entry()
