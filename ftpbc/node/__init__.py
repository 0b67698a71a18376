"""A serving node: providers (pollers + workers) per endpoint, heartbeat, sweeper, recovery."""
