"""Domain events: persisted in the workspace database, pushed to subscribers.

``RigClosedEvent`` (with the close reason), ``RigControlChanged``,
``RigReaped`` (idle, TTL or memory reaping, with the agent that was driving)
and ``RigPhaseChanged``. Opening a rig is not an event (RIGS.md §11).
``ApprovalRequested`` and ``ApprovalDecided`` (rigd.guard) are a workspace's
too; their ``rigId`` is the rig the call named, or ``""`` when it named none
(the conversation's rig may not exist yet).

Order: events get their id from the workspace database in the order they
are published, and each subscriber is fed by one channel, so a subscriber
sees a workspace's events in id order. A subscriber that cannot keep up is
dropped (its channel closed) rather than letting the server's memory grow;
it can catch up from ``rig.events`` with ``afterId``.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from rigd.store.aio import Stores

log = logging.getLogger("rigd.events")

SUBSCRIBER_BUFFER = 1000

#: A tool call waits for a person's answer (rigd.guard): the approval, as approval.list shows it.
APPROVAL_REQUESTED = "ApprovalRequested"
#: It was answered, timed out, or its call went away: ``approvalId``, ``decision``, ``decidedBy``.
APPROVAL_DECIDED = "ApprovalDecided"
#: A registry pull's progress (at most one a second) and its end, to the workspace named
#: by ``image.pull`` (rigd.server.pulls).
IMAGE_PULL_PROGRESS = "ImagePullProgress"
IMAGE_PULL_ENDED = "ImagePullEnded"


class EventBus:
    def __init__(self, stores: Stores) -> None:
        self.stores = stores
        self._subscribers: dict[str, set[trio.MemorySendChannel[dict[str, Any]]]] = {}
        self._lock = trio.Lock()

    def subscribe(self, workspace_id: str) -> trio.MemoryReceiveChannel[dict[str, Any]]:
        send, receive = trio.open_memory_channel[dict[str, Any]](SUBSCRIBER_BUFFER)
        self._subscribers.setdefault(workspace_id, set()).add(send)
        return receive

    def unsubscribe(self, workspace_id: str, channel: trio.MemoryReceiveChannel[dict[str, Any]]) -> None:
        # Receive-side close makes the send side raise on the next publish,
        # which removes it; nothing else to do here.
        channel.close()

    async def publish(self, workspace_id: str, rig_id: str, type_: str, **data: Any) -> dict[str, Any]:
        """Persist, then push. Serialised so ids and delivery order agree."""
        with trio.CancelScope(shield=True):
            async with self._lock:
                db = await self.stores.workspace(workspace_id)
                event_id, at = await self.stores.run(db.add_event, rig_id, type_, data)
                event = {"id": event_id, "type": type_, "rigId": rig_id, "at": at,
                         "workspace": workspace_id, **data}
                for send in list(self._subscribers.get(workspace_id, ())):
                    try:
                        send.send_nowait(event)
                    except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                        self._subscribers[workspace_id].discard(send)
                        send.close()
        log.info("event", extra={"type": type_, "rig": rig_id})
        return event
