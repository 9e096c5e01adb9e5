"""mcp-context-gateway: one MCP entry that fronts many MCP servers and protects a small context window."""

__version__ = "0.1.0"
