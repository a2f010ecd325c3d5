#!/usr/bin/env python
"""Django's command-line entry point."""

import os
import secrets
import sys

# Commands that sign nothing and keep nothing that a SECRET_KEY protects (the simulator replays a trace
# in memory): on a fresh clone they run without one, so a throwaway key is made for this process alone.
OFFLINE_COMMANDS = {"simulate"}

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if len(sys.argv) > 1 and sys.argv[1] in OFFLINE_COMMANDS and not os.environ.get("SECRET_KEY"):
        os.environ["SECRET_KEY"] = secrets.token_urlsafe(50)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
