"""``POST /v1/audio/speech`` and ``POST /v1/audio/transcriptions``:
``protocol`` (their bodies), ``speech`` and ``transcribe`` (a body or form
-> the request it submits), ``speech_render`` and ``transcription_render``
(events -> bytes), ``router`` (handlers, table rows, OpenAPI)."""
