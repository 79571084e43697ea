"""``/v1/realtime``: the OpenAI Realtime API over a WebSocket.

A session (``session.py``) holds a conversation, an input audio buffer
and at most one running response; each response is one request in the
log, its conversation as input (``respond.py``), and its server events
are a pure function of that request's events (``render.py``); with input
transcription on, each committed turn is a request of its own too
(``transcription.py``, its events ``transcript.py``).  The
socket's loop and bad input are ``connection.py``'s; the route
``router.py``'s.  See docs/http.md, "Realtime (WebSocket)".
"""
