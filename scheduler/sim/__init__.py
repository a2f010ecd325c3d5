"""Offline tools: trace readers and the discrete-event simulator (the live tick's policy, replayed)."""
