"""The web tier (gunicorn's WSGI app, daphne's ASGI app) never talks to a Docker engine: it does not even load it.

Terminal and files go through the node's relay (tests/portal/test_terminal.py and test_files.py
prove they work with no Docker reachable from the web tier); this holds the line for code added later.
"""

import subprocess
import sys

from django.conf import settings

LOAD_THE_WEB_TIER = """
import os, sys, django
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
django.setup()
import config.asgi, config.wsgi
from django.urls import get_resolver
get_resolver().url_patterns  # every view module
print(sorted(m for m in sys.modules if m == "docker" or m.startswith(("docker.", "scheduler.node"))))
"""


def test_the_web_and_websocket_servers_load_neither_docker_nor_node_code():
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_THE_WEB_TIER], capture_output=True, text=True, cwd=settings.BASE_DIR, timeout=120
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]", f"the web tier loads {loaded.stdout.strip()}"


def test_no_module_of_the_web_tier_app_imports_docker_or_node_code():
    """Every module under portal/, its packages (console, sockets, api, services, ...) and commands included:
    what talks to an engine (``build_images``) lives with the node side's commands."""
    import ast
    from pathlib import Path

    offenders = []
    portal = Path(settings.BASE_DIR) / "portal"
    for path in sorted(portal.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(portal)}: {n}"
                for n in names
                if n == "docker" or n.startswith(("docker.", "scheduler.node"))
            ]
    assert not offenders, offenders
