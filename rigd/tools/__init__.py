"""What a model sees: the tools and the protocols that carry them.

- ``catalogue``: the tool definitions (``terminal_use``, ``computer_use``,
  ``browser_use``…) and their JSON Schemas, shared by MCP and the agent loop.
- ``dialects``: the vendors' computer-use dialects mapped onto rigd's verbs.
- ``framing``: how a tool's result is framed for the model (stills, text).
- ``mcp``: the tools over MCP (stdio for ``rigd mcp``, streamable HTTP at ``/mcp``).

Only ``mcp`` imports the MCP SDK; the rest stays importable without it.
"""
