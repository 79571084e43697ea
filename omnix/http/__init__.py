"""omnix.http: the OpenAI-compatible HTTP API.

Owns the protocol adapters and nothing else: ``schemas`` (typed bodies),
``adapt`` (bodies -> ``RequestSpec``s), ``routes`` (aiohttp handlers that
submit through ``Omni.submit``/``Omni.cancel`` and tail the log),
``render`` (responses as a pure function of a request's events: the live
handlers and replay share it), ``media`` (decoding audio/image parts at
admission), ``transcribe`` (the transcription form), ``tokens`` (prompt
length before admission, /tokenize), ``audio`` (encoders), ``errors``,
``auth``, ``cors``, ``openapi``, ``options`` (the server's knobs), ``app``
(``build_app``/``HttpServer``) and ``serve`` / ``serve_config`` (the
``omnix serve`` verb and its config file).  Serving scripted pipelines for tests and
benchmarks is ``omnix.testing.serving``'s.  Routing between stages is the
orchestrator's, never this package's.  See docs/http.md.
"""
