"""omnix.transport: how the stage runtime and its workers talk over ZMQ.

Owns: the wire protocol (``messages``), framing and zero-copy arrays
(``codec``), socket setup and loop wake-ups (``sockets``), the receive loop
that decodes and dispatches each message (``inbox``), and the work values
that cross it (``work``).  ``ipc://`` on one host, ``tcp://`` across hosts.
Does not own processes, credits or liveness (``omnix.stages.runtime``) nor
engines.  Never pickles.
"""
