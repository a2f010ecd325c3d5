"""What one instance or job may ask for: the bounds the console forms, the API serializers and
the services share, defined once here.

The upper bounds are product limits, not node sizes: a request within them that
no node can give is refused by the scheduler with the field it exceeds.
"""

from typing import NamedTuple


class Range(NamedTuple):
    min: int
    max: int


MAX_CARDS = 8  # whole cards per instance (one node's worth)
MAX_JOB_CARDS = 512  # whole cards per job: a gang spans nodes
MAX_NODES = 64  # nodes one job may span
CPU_CORES = Range(1, 256)
DEFAULT_CPU_CORES = 2  # what a request without a CPU count gets (fits a small development node)
DEFAULT_MEMORY_GB = 8
MEMORY_GB = Range(1, 4096)
DISK_GB = Range(1, 10240)
# A job's maximum runtime: at least a minute, at most 30 days (also keeps it within a database integer).
MAX_RUNTIME_S = Range(60, 30 * 24 * 3600)
IDLE_MINUTES = Range(1, 7 * 24 * 60)  # idle auto-stop: how long below the threshold
DEFAULT_IDLE_MINUTES = 60
NAME_CHARS = 64
COMMAND_CHARS = 10_000
# A job's environment (``env``): at most this many names, each a shell variable name.
ENV_ENTRIES = 64
ENV_VALUE_CHARS = 4096
ENV_NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"
# A job array: at most this many tasks (each also counts against MAX_QUEUED_PER_USER while queued).
ARRAY_TASKS = 1000
# Its indices are 0 to this (Slurm's default MaxArraySize is 1001; indices are stored as integers).
ARRAY_INDEX_MAX = 1_000_000
