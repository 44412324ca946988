"""Sharing one database between processes: a host serving it on a Unix socket, and relays for stdio clients."""
