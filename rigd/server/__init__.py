"""The HTTP face of rigd: JSON-RPC over POST and WebSocket, and the terminal lane."""
