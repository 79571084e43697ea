"""omnix.transport: how the stage runtime and its workers talk over ZMQ.

Owns: the wire protocol (``messages``), framing and zero-copy arrays
(``codec``) and socket setup (``sockets``).  ``ipc://`` on one host,
``tcp://`` across hosts.  Does not own processes, credits or liveness
(``omnix.stages.runtime``) nor engines.  Never pickles.
"""
