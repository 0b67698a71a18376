"""Cluster coordination: the poll lock (T_LOCK + F_LOCK), heartbeats and leases."""
