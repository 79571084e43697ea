"""``POST /v1/completions`` (OpenAI's legacy API, as vLLM serves it):
``protocol``, ``plan``, ``render``, ``router``, as in ``omnix.http.chat``."""
