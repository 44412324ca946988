"""The JSON-RPC layer: framing, params, start-up, the server and its handlers (the only home of pygls)."""
