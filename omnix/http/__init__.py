"""omnix.http: the OpenAI-compatible HTTP API.

Owns the protocol adapters and nothing else: ``schemas`` (typed bodies),
``adapt`` (bodies -> ``RequestSpec``s), ``routes`` (aiohttp handlers that
submit through ``Omni.submit``/``Omni.cancel`` and tail the log),
``render`` (responses as a pure function of a request's events: the live
handlers and replay share it), ``audio`` (encoders), ``errors``, ``auth``,
``openapi``, ``app`` (``build_app``/``HttpServer``) and ``serve`` (the
``omnix serve`` verb).  Serving scripted pipelines for tests and
benchmarks is ``omnix.testing.serving``'s.  Routing between stages is the
orchestrator's, never this package's.  See docs/http.md.
"""
