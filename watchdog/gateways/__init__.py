"""Our own processes that witness an agent from outside its code: `exec` (the process-tree
supervisor) and the MCP proxy. They write through the SDK's write path and the store's verbs,
never the daemon's power: a gateway can stop a run cooperatively, only the daemon signals."""
