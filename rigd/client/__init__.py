"""The clients of a rigd server, all over its public HTTP surface.

- ``cli``: the ``rigd`` command (``rigd serve`` starts the server; every other
  subcommand is a client of one) and :class:`~rigd.client.cli.Client`, the RPC client.
- ``lanes``: the clipboard and file lanes (``/rig/clip``, ``/rig/files``).
- ``terminal``: the terminal lane's client (``rigd term``).
- ``agent``: the reference agent loop (``rigd agent``): a model, the tools, a rig.
"""
