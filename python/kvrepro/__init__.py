"""kvrepro's transformers lane.

Runs transformers' own sliding-window cache layers (and custom layers written
from their descriptions, docs/DESIGN.md §3) in eager mode and under
torch.compile, and records each greedy decode as a run in the kvrepro HDF5
report schema (docs/SCHEMA.md), so that the C tool's `gate --external`,
`show`, `diff` and `bisect` read them beside its own runs.
"""

__version__ = "0.1.0"
