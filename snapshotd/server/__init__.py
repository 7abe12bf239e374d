"""The socket: NDJSON framing, JSON-RPC dispatch, wire param validation, connection budgets, and the clients."""
