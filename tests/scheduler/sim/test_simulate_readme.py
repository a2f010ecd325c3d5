"""The README's simulator command, run as written on a fresh clone: no SECRET_KEY, no database."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DAY = 86400


def readme_simulate_command() -> list[str]:
    """The ```sh block under "## Simulator", joined across its continuation lines."""
    section = (ROOT / "README.md").read_text().split("## Simulator", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)[1]
    return shlex.split(block.replace("\\\n", " "))


def test_the_readme_simulator_command_runs_without_a_secret_key(tmp_path):
    command = readme_simulate_command()
    assert command[:3] == [".venv/bin/python", "manage.py", "simulate"]
    # The README's trace is a large file of the shared folder: the same command on a small trace of the same
    # shape (jobs before and inside the window that --start-day/--days select), the plot into tmp_path.
    trace = tmp_path / "trace.csv"
    trace.write_text(f"submit_time,duration,num_gpus\n0,600,1\n{28 * DAY + 60},600,2\n{28 * DAY + 120},900,4\n")
    command[command.index("--trace") + 1] = str(trace)
    if "--plot" in command:
        command[command.index("--plot") + 1] = str(tmp_path / "plot.png")
    command[0] = sys.executable
    environment = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "DATABASE_URL")}
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["jobs"] == 2 and line["finished"] == 2
