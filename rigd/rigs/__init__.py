"""The rig domain: what a rig is to the server, whatever machine runs it.

- ``manager`` (:class:`~rigd.rigs.manager.RigManager`): every live rig, its
  phase, owner, watches, leases and audit log; opens and closes machines
  through a backend and keeps each rig a failure boundary.
- ``live``: one open rig (its machine, its gate, its tasks).
- ``api``: the rig verbs (``rig.*`` RPC methods) parsed into typed calls.
- ``params``: ``rig.open``'s parameters, parsed at the edge into a typed plan.
- ``render``: a rig as the JSON the clients read.
- ``lifecycle``: phases and the transitions allowed between them.
- ``scheduler``: TTL, idle park and reap.
- ``failure``: how an exception from a rig's tasks becomes the rig's failure.
- ``events``: the event bus the page and the RPC subscribers read.
- ``guard``: admission (host memory and CPU pressure, per-user limits).

Nothing here imports the HTTP server (``rigd.server``) or a client (``rigd.client``).
"""
