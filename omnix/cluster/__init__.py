"""Serving one pipeline from several processes over a replicated log.

A leader (``omnix serve --log nats://...``) appends; a standby follows the
log and takes over when the leader's lease lapses; stateless frontends
(``omnix frontend``) serve the HTTP API by following the log and handing
what they must append to the leader.  This package holds what those
processes say to each other (``wire``), the leader's side of it
(``answerer``), a frontend's stand-in for ``Omni`` (``remote``) and the
surface the HTTP layer needs of either (``front``).

It does not own the replicated log or the lease (``omnix.events.natslog``,
``omnix.events.lease``) nor the HTTP server.
"""
