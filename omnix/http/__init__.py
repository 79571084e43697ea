"""omnix.http: the OpenAI-compatible HTTP API.

Owns the protocol adapters and nothing else, cut by route, one room per
API: ``chat``, ``completions``, ``audio`` (speech, transcriptions),
``images``, ``models`` (the model list, /tokenize), ``requests`` (omnix's
routes about a request, and the list of them), ``files``, ``admin``
(health, readiness, version, metrics, profiling, the OpenAPI document).
A room holds its protocol (typed bodies), its plan (a body -> the
``RequestSpec``s it submits, with their typed response options), its
render (events -> bytes) and its router (handler, table row, OpenAPI
operation).  ``routes`` is the route table that ``app`` registers
(``build_app``/``HttpServer``) and ``openapi`` describes; ``render`` holds
the rendering entry points the live handlers and replay share (responses
as a pure function of a request's events); ``core`` the plumbing every
route calls (bodies, errors, auth, CORS, admission, the live loop, resume,
groups); ``common`` what the rooms share beyond it (body pieces,
planning's and rendering's common ground); ``media`` the decoding of audio/image parts at admission;
``options`` the server's knobs; ``serve`` the ``omnix serve`` verb's
lifecycle, ``serve_flags`` its flags, ``serve_options`` what they build,
``serve_config`` its config file, ``serve_cluster`` leading a replicated
log, ``quantities`` the durations, sizes and counts flags take.  Serving scripted pipelines for tests
and benchmarks is ``omnix.testing.serving``'s.  Routing between stages is
the orchestrator's, never this package's.  See docs/http.md.
"""
