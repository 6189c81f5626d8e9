"""Constants every inference stage shares, defined once.

Units and codes, not tuning: a stage's thresholds live in its own parameters dataclass.
"""

from prism_core.schema import COMM_KINDS

NS_PER_S = 1_000_000_000

# Integer codes of the comm_pairs kinds, in COMM_KINDS order; a pair carrying several kinds takes
# the lowest. UNCLASSIFIED marks flows on pairs no kind was given to.
DP, PP, OTHER = (COMM_KINDS.index(kind) for kind in ("dp", "pp", "other"))
UNCLASSIFIED = len(COMM_KINDS)
KIND_CODES = {kind: COMM_KINDS.index(kind) for kind in COMM_KINDS}
# Columns parallelism adds to a job's flows for the timeline (Parallelism.labelled): each flow's
# kind code, and the smallest size of its size family (flows of one family are one transfer size).
FLOW_KIND = "kind"
FLOW_FAMILY_BYTES = "family_bytes"

# One flow at least this large between a job's GPU and an address of no job is checkpoint I/O (a
# save's shard write, or its read back on a resume): checkpoint shards are hundreds of MiB to GiB,
# while data-loader reads and metadata traffic stay in the low MiB. Policy, shared by recognition
# (a saving job is busy), the split of flows by job (reads go to the job that saved), timeline and
# diagnosis (checkpoint steps).
CHECKPOINT_FLOW_BYTES = 64 << 20
