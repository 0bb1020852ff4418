"""The HTTP face of rigd: JSON-RPC over POST and WebSocket, the terminal and live
lanes, the clipboard and file lanes, MCP at ``/mcp``, image imports, and the page."""
