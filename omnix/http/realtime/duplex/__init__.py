"""``/v1/realtime?duplex=1``: a full-duplex speech model over a WebSocket,
in vLLM-Omni's duplex vocabulary (OpenAI Realtime events plus its own).

A session is one request in the log (``DuplexOptions``): the client's audio
goes in frame by frame as it streams (``InputAppended``, one per 80 ms
frame), the model's frames come out as its chunks, and the server events a
client reads are a pure function of that request's events (``render.py``),
so a client that comes back (``session.resume``) gets what it had not read
from the log.  The messages are ``protocol.py``'s, the session's
configuration ``config.py``'s, the audio's wire forms ``audio.py``'s, what
each client event does ``session.py``'s, the socket and its bounded output
``connection.py``'s.  See docs/http.md, "Full duplex".
"""
