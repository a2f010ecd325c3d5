"""Secrets from files, and a service URL's password apart from the URL and back.

A secret comes from the file ``NAME_FILE`` names (a Docker or systemd secret, the production stack's SECRETS_DIR),
else from ``NAME`` itself: so secrets stay out of ``docker inspect`` and process environments. A URL's password
goes to programs in their environment (juicefs's META_PASSWORD), while the rest of an address stays plain
configuration.
"""

from urllib.parse import quote, unquote, urlsplit, urlunsplit

import environ


class SecretFiles(environ.FileAwareMapping):
    """The environment, where NAME_FILE names a file holding NAME's value (django-environ's file-aware mapping); one
    trailing newline, as ``echo`` leaves, is not part of the value."""

    def __getitem__(self, key):
        value = super().__getitem__(key)
        return value[:-1] if value.endswith("\n") and self.env.get(f"{key}_FILE") else value


def secret(name: str) -> str:
    """The secret ``name`` now: its file's (``NAME_FILE``) or its variable's, "" when neither is set."""
    try:
        return SecretFiles(cache=False)[name]
    except KeyError:
        return ""


def password_apart(url: str) -> tuple[str, str | None]:
    """The URL without its password, and the password (None where it has none)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url, None
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{parts.username}@{host}" if parts.username else host
    return urlunsplit(parts._replace(netloc=netloc)), unquote(parts.password)


def url_with_password(url: str, password: str) -> str:
    """The URL logging in with ``password`` (quoted as a URL needs), in place of any it had."""
    bare, _ = password_apart(url)
    parts = urlsplit(bare)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{parts.username or ''}:{quote(password, safe='')}@{host}"
    return urlunsplit(parts._replace(netloc=netloc))
