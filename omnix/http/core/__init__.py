"""The plumbing every route of the HTTP API calls.

Owns what no route owns alone: errors and their middleware (``errors``),
the API key (``auth``), CORS (``cors``), reading bodies and the headers of
a generation (``body``), the route table's row (``route``) and the
OpenAPI building blocks (``doc``), the state the handlers share
(``server``), planning's common ground (``plan``: ``Served``, ``Plan``,
request ids and groups; ``sampling``: parameters per stage and engine),
a prompt's length (``tokens``), admission (``submit``), the live response
(``live``: tail the log, render, write; ``respond``: the writes;
``readers``: who follows a stream, and the grace a dropped one gets),
resuming a stream (``resume``), and rendering's common ground
(``rendering``: heads, SSE framing and ids, error events, stream endings;
``summary``: a request's outputs folded from its events; ``groups``:
batches and n-sample streams; ``audio``: encoders).

Does not own any route: each lives in its room (``omnix.http.chat``,
``completions``, ``audio``, ``images``, ``models``, ``requests``,
``files``, ``admin``), and ``omnix.http.routes`` lists them.
"""
