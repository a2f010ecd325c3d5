"""The console's live side, served by daphne: the WebSocket routes (routing.py), API-token sign-in on a
handshake (auth.py), instance events and GPU monitoring (monitor.py, fanned out in-process by fanout.py),
the web terminal and log follow (terminal.py, logs.py)."""
