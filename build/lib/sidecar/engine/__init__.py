"""Pure engine logic: token estimates, message handling, assembly, usage. No I/O here."""
