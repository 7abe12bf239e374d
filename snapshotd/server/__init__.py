"""The socket's server: listening, connections and their budgets, JSON-RPC dispatch to the engine."""
