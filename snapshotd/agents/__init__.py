"""What agent tools plug into: hooks, the settings splicer and the MCP server."""
