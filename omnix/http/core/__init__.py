"""The plumbing of a request's life through the HTTP API, which every route calls.

Owns: errors and their middleware (``errors``), the API key (``auth``),
CORS (``cors``), reading a body and the headers of a generation
(``body``), the route table's row (``route``), the state the handlers
share (``server``), admission (``submit``: the HTTP side of
``Omni.submit_group``), the live response (``live``: tail the log,
render, write; ``respond``: the writes, the SSE writer; ``readers``: who
follows a stream, and the grace a dropped one gets), resuming a stream
(``resume``), and the calls that submit several requests (``groups``:
batches and the one stream of n samples).

Does not own any route: each lives in its room (``omnix.http.chat``,
``completions``, ``audio``, ``images``, ``models``, ``requests``,
``files``, ``admin``), and ``omnix.http.routes`` lists them.  What the
rooms and the core share beyond plumbing (body pieces, planning's and
rendering's common ground) is ``omnix.http.common``.
"""
