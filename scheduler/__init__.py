"""The cluster: nodes, cards, the queued and placed units of work, containers."""
