"""The folder says which process runs a line: the control plane never imports the GPU host's code.

``portal``, ``billing`` and ``scheduler`` never import ``agent`` (nor Docker): they reach a host only
through the messages of ``core.messages``. The web tier (gunicorn's WSGI app, daphne's ASGI app) and the
control-plane worker (``celery -A config``, its tasks discovered) must not even load it: terminal and files
go through the node's relay (tests/portal/test_terminal.py and test_files.py prove they work with no
Docker reachable from the web tier). ``agent`` itself is an installed app for its commands, so Django
loads its package and its ``apps`` module, which import nothing of the host.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

CONTROL_PLANE = ("portal", "billing", "scheduler")
HOST_MODULES = """
print(sorted(m for m in sys.modules
             if m == "docker" or m.startswith("docker.") or (m.startswith("agent.") and m != "agent.apps")))
"""
LOAD_THE_WEB_TIER = (
    """
import os, sys, django
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
django.setup()
import config.asgi, config.wsgi
from django.urls import get_resolver
get_resolver().url_patterns  # every view module
"""
    + HOST_MODULES
)
LOAD_THE_SCHEDULER_WORKER = (
    """
import os, sys, django
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
django.setup()
from config.celery import app
app.loader.import_default_modules()  # what `celery -A config worker` does at start: autodiscovery included
from core.messages import ToScheduler
assert set(ToScheduler) <= set(app.tasks), sorted(app.tasks)  # it did discover the control plane's tasks
"""
    + HOST_MODULES
)


def _loaded(script: str) -> str:
    loaded = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=settings.BASE_DIR, timeout=120
    )
    assert loaded.returncode == 0, loaded.stderr
    return loaded.stdout.strip()


def test_the_web_and_websocket_servers_load_neither_docker_nor_host_code():
    assert _loaded(LOAD_THE_WEB_TIER) == "[]"


def test_the_control_plane_worker_loads_neither_docker_nor_host_code():
    assert _loaded(LOAD_THE_SCHEDULER_WORKER) == "[]"


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


@pytest.mark.parametrize("app", CONTROL_PLANE)
def test_no_module_of_the_control_plane_imports_the_agent_or_docker(app):
    """Every module, its packages, commands and migrations included: what talks to an engine
    (``build_images``, ``node_agent``, ``fence``) lives with the host's commands in ``agent/``."""
    root = Path(settings.BASE_DIR) / app
    offenders = [
        f"{path.relative_to(root.parent)}: {name}"
        for path in sorted(root.rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] in ("agent", "docker")
    ]
    assert not offenders, offenders


def test_the_rule_sees_an_import_of_the_agent(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from agent.launcher import docker_client\n")
    assert _imports(planted) == ["agent.launcher"]


PROJECT_APPS = ("portal", "billing", "scheduler", "agent", "config")


def test_the_core_imports_no_app_of_the_project():
    """``core`` is the ground every app and host stands on (issue 32 §5): errors, clock, messages, relay contract,
    clients. The one thing it takes from above is the Celery app, wiring, looked up when a message is sent."""
    root = Path(settings.BASE_DIR) / "core"
    offenders = [
        f"{path.name}: {name}"
        for path in sorted(root.rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] in PROJECT_APPS and name != "config.celery"
    ]
    assert not offenders, offenders
    assert {path.name for path in root.glob("*.py")} >= {"errors.py", "clock.py", "messages.py", "relay.py"}


WRITES = {"create", "update", "bulk_create", "bulk_update", "delete", "get_or_create", "update_or_create"}


def _scheduler_table_writes(path: Path) -> list[str]:
    """``<scheduler model>.objects....<write>(...)`` calls, and writes through ``type(x).objects``."""
    tree = ast.parse(path.read_text())
    models = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "scheduler.models"
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES):
            continue
        chain = node.func.value
        while isinstance(chain, (ast.Call, ast.Attribute)):
            if isinstance(chain, ast.Attribute) and chain.attr == "objects":
                owner = chain.value
                if (isinstance(owner, ast.Name) and owner.id in models) or (
                    isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "type"
                ):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node.func)[:80]}")
                break
            chain = chain.func if isinstance(chain, ast.Call) else chain.value
    return found


def test_the_portal_writes_the_schedulers_tables_through_its_services_only():
    """Groups, disks and events of work are the scheduler's: the portal asks scheduler.services (issue 32 §5)."""
    root = Path(settings.BASE_DIR) / "portal"
    offenders = [
        w
        for path in sorted(root.rglob("*.py"))
        if "migrations" not in path.parts
        for w in _scheduler_table_writes(path)
    ]
    assert not offenders, offenders


def test_the_write_rule_sees_a_write(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from scheduler.models import WorkloadEvent as E\n"
        "def f(i):\n    E.objects.create(reason='x')\n    type(i.workload).objects.filter(pk=1).update(disk_gb=2)\n"
    )
    assert len(_scheduler_table_writes(planted)) == 2
