"""omnix.replay: what a captured trace can be made to show and do.

``omnix.traceview`` folds a trace into a timeline (text or HTML); ``drive`` runs the real
orchestrator against its recorded inputs, strictly; ``freerun`` runs them
leniently under another config, rules or faults; ``counterfactual`` and
``faults`` build on that run; ``client`` regenerates the bytes a client
received; ``cli`` and ``trace_cli`` are the ``omnix replay`` and ``omnix
trace`` verbs.  The trace format itself is ``omnix.trace``.
"""
