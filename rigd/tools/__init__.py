"""What a model sees: the tools and the protocols that carry them.

- ``catalogue``: the tool definitions (``terminal_use``, ``computer_use``,
  ``browser_use``…) and their JSON Schemas, shared by MCP and the agent loop.
- ``dialects``: the vendors' computer-use dialects mapped onto rigd's verbs.
- ``listing``: a ``tools.list`` reply as its clients read it (definitions, their schemas'
  validators, argument checks), shared by ``mcp`` and the agent loop.
- ``mcp``: the tools over MCP (stdio for ``rigd mcp``, streamable HTTP at ``/mcp``).

Only ``mcp`` imports the MCP SDK; the rest stays importable without it. How guest output
is framed as untrusted is ``rigd.framing``, below this package (backends use it too).
"""
