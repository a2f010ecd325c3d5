"""What every app and every host uses: the error type, the database's clock, the messages between processes,
the relay's contract, the shared clients. It imports no app of the project (tests/test_layout.py)."""
