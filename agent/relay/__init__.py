"""The node agent's relay: terminal and files of this host's containers, for the web tier (core/relay.py).

server.py    the aiohttp application, its routes (one handler per operation) and its thread
guard.py     what every request must pass: the signed ticket, the container's labels
terminal.py  a shell with a TTY over a WebSocket
files.py     list, download, upload, streamed
paths.py     paths resolved through Docker's archive stat, links kept inside their root
streams.py   bounded hand-over between the event loop and Docker's blocking calls; tar on the fly
"""
