"""What the tasks of a job array are: Slurm's ``--array`` syntax, parameter grids, each task's environment.

Pure functions (no database); errors are ``InvalidInput`` naming the field the user wrote.

- ``array``: ``"0-31%4"`` (indices 0..31, at most 4 running at once), ``"0-9"``, ``"1,3,5%2"``,
  ``"0-15:4"`` (a step: 0, 4, 8, 12), as Slurm's ``sbatch --array``.
- ``params``: ``{"lr": ["1e-3", "3e-4"], "bs": ["32", "64"]}``: one task per combination
  (the Cartesian product, in the order given), indexed 0..N-1.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from core.errors import InvalidInput
from portal import limits
from scheduler import envnames

RANGE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?", re.ASCII)  # not full-width or other digits
NAME = re.compile(limits.ENV_NAME_PATTERN)


@dataclass(frozen=True)
class Task:
    index: int
    params: dict[str, str] = field(default_factory=dict)


def parse_array(spec: str) -> tuple[list[int], int | None]:
    """Slurm array syntax -> (sorted distinct indices, the %N limit or None)."""
    text = (spec or "").strip()
    if not text:
        raise InvalidInput('give task indices, e.g. "0-31%4" (0..31, at most 4 at once) or "1,3,5"', field="array")
    body, sep, limit_text = text.partition("%")
    limit = None
    if sep:
        if not (limit_text.isascii() and limit_text.isdigit()) or not 1 <= int(limit_text) <= limits.ARRAY_TASKS:
            why = f"after % give how many tasks may run at once (1 to {limits.ARRAY_TASKS})"
            raise InvalidInput(f'"%{limit_text}": {why}', field="array")
        limit = int(limit_text)
    indices: set[int] = set()
    for part in body.split(","):
        part = part.strip()
        match = RANGE.fullmatch(part)
        if match is None:
            raise InvalidInput(f'"{part}" is not an index or a range like 0-31 or 0-15:4', field="array")
        low, high, step = int(match[1]), int(match[2] or match[1]), int(match[3] or 1)
        if high < low:
            raise InvalidInput(f'"{part}": the range ends before it starts', field="array")
        if step < 1:
            raise InvalidInput(f'"{part}": the step must be 1 or more', field="array")
        if high > limits.ARRAY_INDEX_MAX:
            raise InvalidInput(f'"{part}": indices go up to {limits.ARRAY_INDEX_MAX:,}', field="array")
        if (high - low) // step + 1 + len(indices) > limits.ARRAY_TASKS:
            raise InvalidInput(f"at most {limits.ARRAY_TASKS} tasks in one array", field="array")
        indices.update(range(low, high + 1, step))
    return sorted(indices), limit


def parse_params(params: dict) -> list[dict[str, str]]:
    """A grid {name: [values]} -> one {name: value} per combination (the first name varies slowest)."""
    if not isinstance(params, dict) or not params:
        raise InvalidInput('give each parameter its values, e.g. {"lr": ["1e-3", "3e-4"]}', field="params")
    for name, values in params.items():
        if not NAME.fullmatch(str(name)):
            why = "is not a parameter name (letters, digits, _; not a digit first)"
            raise InvalidInput(f"{name!r} {why}", field="params")
        if reserved := envnames.why_reserved(str(name)):  # each parameter is a variable of its task too
            raise InvalidInput(f"{name} cannot be a parameter: {reserved}", field="params")
        if not isinstance(values, list) or not values:
            raise InvalidInput(f"{name}: give a list of one or more values", field="params")
        if any(not isinstance(v, str | int | float) or isinstance(v, bool) for v in values):
            raise InvalidInput(f"{name}: each value must be a string or a number", field="params")
    count = 1
    for values in params.values():
        count *= len(values)
    if count > limits.ARRAY_TASKS:
        raise InvalidInput(f"{count} combinations: at most {limits.ARRAY_TASKS} tasks in one array", field="params")
    names = list(params)
    return [dict(zip(names, map(str, combo), strict=True)) for combo in itertools.product(*params.values())]


def tasks_of(*, array: str | None, params: dict | None) -> tuple[list[Task], int | None]:
    """The tasks of an array given either Slurm indices or a parameter grid (not both), and its %N limit."""
    if bool(array) == bool(params):
        raise InvalidInput('give either "array" (e.g. "0-31%4") or "params" (a grid), not both', field="array")
    if array:
        indices, limit = parse_array(array)
        return [Task(i) for i in indices], limit
    return [Task(i, combo) for i, combo in enumerate(parse_params(params))], None


def task_env(task: Task, *, array_id: int, tasks: list[Task]) -> dict[str, str]:
    """What each task's container gets on top of the job's own environment."""
    indices = [t.index for t in tasks]
    env = {
        "GPUCLOUD_ARRAY_ID": str(array_id),
        "GPUCLOUD_ARRAY_INDEX": str(task.index),
        "GPUCLOUD_ARRAY_COUNT": str(len(tasks)),
        # For scripts written for Slurm.
        "SLURM_ARRAY_JOB_ID": str(array_id),
        "SLURM_ARRAY_TASK_ID": str(task.index),
        "SLURM_ARRAY_TASK_COUNT": str(len(tasks)),
        "SLURM_ARRAY_TASK_MIN": str(min(indices)),
        "SLURM_ARRAY_TASK_MAX": str(max(indices)),
    }
    for name, value in task.params.items():
        env[name] = value
        env[f"GPUCLOUD_PARAM_{name.upper()}"] = value
    return env
