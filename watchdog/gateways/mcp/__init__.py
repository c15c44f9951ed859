"""agent-watchdog mcp-proxy: a JSON-RPC relay in front of an MCP server that guards `tools/call`
(optional extra `mcp`). See docs/howto/gateways.md."""
