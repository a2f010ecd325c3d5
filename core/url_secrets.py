"""A service URL's password, apart from the URL and back: secrets come from files (``NAME_FILE``) and go to
programs in their environment, while the rest of an address stays in plain configuration."""

from urllib.parse import quote, unquote, urlsplit, urlunsplit


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
