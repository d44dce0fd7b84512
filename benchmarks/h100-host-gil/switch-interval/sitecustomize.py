"""An arm of benchmarks/h100-host-gil/chain.sh, not part of the package: with this folder first on PYTHONPATH, every
Python process of the run (the bench, the servers it starts) lets a thread waiting for the GIL take it after
0.5 ms instead of Python's 5 (``sys.setswitchinterval``). A head thread that gives the GIL up for each numpy or
torch call waits to take it back while a pure-Python thread holds it; at 16 clients the heads stage took 213 ms
for 26 ms of CPU (h100-server-cpu). The arm tells whether that wait is the switch interval's."""

import sys

sys.setswitchinterval(0.0005)
print(f"sitecustomize: GIL switch interval {sys.getswitchinterval() * 1e3:g} ms", file=sys.stderr)
