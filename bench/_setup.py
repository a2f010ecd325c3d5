"""Make the project importable from bench/ scripts (policy code needs no Django); set up a bench database;
the ``--quick`` sizes of ``make bench-smoke`` and the one JSON line every bench ends with."""

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The benches' own instance of cluster.sh's address plan (a session running beside another picks its own).
CLUSTER_PREFIX = os.environ.get("CLUSTER_PREFIX", "gcb")
CLUSTER_NET = int(os.environ.get("CLUSTER_NET", "237"))


def _traces() -> Path:
    """TRACES_DIR, else the ``shared/traces`` folder beside the checkout or beside any folder above it (a
    worktree or a CI checkout one level deeper finds the same one); the plain default when none exists."""
    if os.environ.get("TRACES_DIR"):
        return Path(os.environ["TRACES_DIR"])
    for folder in ROOT.parents:
        if (folder / "shared" / "traces").is_dir():
            return folder / "shared" / "traces"
    return ROOT.parent / "shared" / "traces"


TRACES = _traces()
sys.path.insert(0, str(ROOT))


def commit() -> str:
    """The commit measured (``-dirty`` when tracked files differ from it), for a result's "commit" field."""
    import subprocess

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (
        "-dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    )


# make test's settings (a connection per request, a fast password hasher): the servers a bench starts
# run with production's, whatever the shell that started the bench had set.
TEST_ONLY = ("DB_CONN_MAX_AGE", "TEST_FAST_PASSWORD_HASHER")


def production_environ() -> dict:
    """This process's environment without make test's settings, for the servers a bench starts."""
    return {name: value for name, value in os.environ.items() if name not in TEST_ONLY}


def parse(parser: argparse.ArgumentParser, **quick) -> argparse.Namespace:
    """The command line, with ``--quick``: the small sizes given here (``make bench-smoke``), unless set."""
    sizes = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in quick.items())
    parser.add_argument("--quick", action="store_true", help=f"a small run for make bench-smoke ({sizes})")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args()
    return args


def report(result: dict, *, errors: int) -> None:
    """Print a bench's last line: its figures, how many errors it met (bench-smoke fails on any), the commit."""
    print(json.dumps({**result, "errors": errors, "commit": commit()}), flush=True)


def database_drop(database_url: str) -> None:
    """Drop the PostgreSQL database ``database_url`` names, if it exists."""
    import subprocess

    server, name = database_url.rsplit("/", 1)
    subprocess.run(["psql", f"{server}/postgres", "-qc", f"DROP DATABASE IF EXISTS {name}"], check=True)


def database_create(database_url: str, *, template: str | None = None) -> None:
    """(Re)create the PostgreSQL database ``database_url`` names: empty, or a copy of database ``template``."""
    import subprocess

    database_drop(database_url)
    server, name = database_url.rsplit("/", 1)
    create = f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else "")
    subprocess.run(["psql", f"{server}/postgres", "-qc", create], check=True)


def fresh_database(database_url: str, **environ: str) -> None:
    """Recreate the bench's own PostgreSQL database, point Django at it (Redis db 14), migrate."""
    import os
    import secrets

    database_create(database_url)
    os.environ.update(
        DATABASE_URL=database_url,
        REDIS_URL=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
        SECRET_KEY=secrets.token_urlsafe(40),
        DJANGO_SETTINGS_MODULE="config.settings",
        LOG_LEVEL="WARNING",
        **environ,
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("make_signing_keys", verbosity=0)  # the processes it starts sign their Celery messages
    call_command("migrate", "--no-input", verbosity=0)
