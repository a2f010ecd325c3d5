"""PostgreSQL settings the platform sets on a role (``ALTER ROLE … SET``): what takes effect in its new sessions."""

from psycopg import sql


def idle_in_transaction_limit(role: sql.Composable, database: str, seconds: float) -> sql.Composed:
    """The statement that has the server end a session of ``role`` in ``database`` left idle inside a transaction
    for ``seconds`` (its transaction rolls back, its locks go): a client cut off before its COMMIT holds nothing
    longer. Any role may run it for itself (``sql.SQL("CURRENT_USER")``); for another, a role that may alter it."""
    return sql.SQL("ALTER ROLE {} IN DATABASE {} SET idle_in_transaction_session_timeout = {}").format(
        role, sql.Identifier(database), sql.Literal(f"{int(seconds * 1000)}ms")
    )
