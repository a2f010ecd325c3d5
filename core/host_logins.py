"""A GPU host's own login to a shared service (``redis_host_user``, ``registry_host_user``): the commands' one shape.

The password comes in a file or on standard input, never on the command line, and only its SHA-256 is kept.
"""

import hashlib
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from core.messages import is_node_name

PASSWORD_MIN = 16


def first_line(path: str) -> str:
    """The password in the file's first line ("-": standard input), "" when there is none."""
    if path == "-":
        text = sys.stdin.read()
    else:
        text = Path(path).read_text() if Path(path).is_file() else ""
    return (text.splitlines() or [""])[0].strip()


def password_sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


class HostLoginCommand(BaseCommand):
    """``--host NAME --password-file F|-`` sets the host's login from the password's SHA-256 (``login_set``);
    ``--remove`` deletes it (``login_remove``)."""

    service = ""  # what the password is for, in the messages: "Redis", "registry"
    remove_help = ""

    def add_arguments(self, parser):
        parser.add_argument("--host", required=True, help="the node's name")
        parser.add_argument(
            "--password-file",
            help=f"a file holding the host's {self.service} password (first line); - reads it from stdin",
        )
        parser.add_argument("--remove", action="store_true", help=self.remove_help)

    def handle(self, *args, host, password_file, remove, **options):
        if not is_node_name(host):
            raise CommandError(f"--host: '{host}' is not a node name (letters, digits, '-' and '_')")
        if remove:
            self.login_remove(host)
            return
        if not password_file:
            raise CommandError(f"--password-file: name the file holding the host's {self.service} password")
        password = first_line(password_file)
        if len(password) < PASSWORD_MIN:
            raise CommandError(
                f"--password-file: {password_file} holds no password of {PASSWORD_MIN} characters or more"
            )
        self.login_set(host, password_sha256(password))

    def login_set(self, host: str, sha256: str) -> None:
        raise NotImplementedError

    def login_remove(self, host: str) -> None:
        raise NotImplementedError
