"""Writes on the cluster: workloads (submit/start/stop/release), lifecycle (CAS transitions),
allocation (shares under locks) and nodes (registry, heartbeats, loss)."""
