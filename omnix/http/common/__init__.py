"""What the routes' rooms (and the core) share that is not plumbing.

Owns: the body pieces several routes' protocols are built of (``fields``:
value types, messages and their content parts, ``StreamOptions``, the
sampling fields of chat and completions, ``Usage``), planning's common
ground (``plan``: ``PlanContext``, ``Plan``, request ids and a call's group;
``sampling``: the parameters per stage and the engines that honour them;
``tokens``: a prompt's length and the tokenizer routes' tokenizer),
rendering's common ground (``rendering``: heads, SSE framing and ids,
error events, how chunk streams end, ``RENDER_VERSION``; ``summary``: a
request's outputs folded from its events; ``audio``: the encoders), and
the OpenAPI building blocks (``doc``).

Imports nothing of the rooms nor of ``omnix.http.core`` but its errors.
"""
