"""`trtbuild tune`: the smallest FP32 set that meets every tolerance, written as a policy.

Why not Polygraphy's `debug precision` or ModelOpt AutoCast: the first bisects
a prefix or suffix of layers and needs weak typing, which TensorRT 11 removed;
the second picks FP32 nodes by value range and never checks the converted
model's accuracy. Here every candidate is judged by the same evaluator as
`build` (FP16 storage emulated faithfully on the CPU), and the search moves
whole groups (normalization units, attention blocks), so a unit is never split.

The search, top to bottom (`groups`, `pool`, `search`, `output`):
1. groups: tunable compute nodes (those the policy's own rules leave at the
   default) in normalization units, attention blocks, or alone;
2. range analysis: groups whose tensors leave the low precision's range (FP16
   or BF16) on the reference data, at any shape, are pinned first;
3. grow: while the candidate fails, an overflow (the first tensor the emulation
   turns non-finite) pins its own group, or the nearest one upstream; otherwise
   one emulated run beside the reference ranks the groups on the failing
   outputs' paths by where the error jumps (and what such a jump amplifies);
   where it scores them all alike, each one's error alone ranks them (`alone`);
   the search pins 1, 2, 4, ... of the most suspect until a candidate passes,
   and halves back to the shortest passing run;
4. shrink (delta debugging): unpin chunks of the pinned groups, costliest first,
   halving the chunk down to single groups; a chunk stays unpinned when every
   tolerance still holds at every shape, and each remaining pin keeps the error
   that made it necessary. A group whose reference values would be inf in the
   low precision is never unpinned.
A pin set is judged once on each point and sample: the search remembers every
verdict (the growing's answer is judged again only at the points it left out).
Ties are broken by a seeded shuffle, so a seed gives the same policy every run,
whatever `jobs` is.
"""

from trtbuild.cores import default_jobs
from trtbuild.tuning.groups import Group, candidate_precision, groups, name_regex, node_flops
from trtbuild.tuning.output import (
    OBJECTIVES,
    Progress,
    budget_warning,
    check_args,
    check_output,
    check_policy,
    pins,
    stuck_warning,
    tight_warning,
    tuned_policy,
    write_log,
)
from trtbuild.tuning.pool import TrialOutcome, error_map, evaluate
from trtbuild.tuning.search import Search, SearchResult, Trial, tune

__all__ = [
    "OBJECTIVES",
    "Group",
    "Progress",
    "Search",
    "SearchResult",
    "Trial",
    "TrialOutcome",
    "budget_warning",
    "candidate_precision",
    "check_args",
    "check_output",
    "check_policy",
    "default_jobs",
    "error_map",
    "evaluate",
    "groups",
    "name_regex",
    "node_flops",
    "pins",
    "stuck_warning",
    "tight_warning",
    "tune",
    "tuned_policy",
    "write_log",
]
