"""``GET /v1/models``, ``POST /tokenize``, ``POST /detokenize``:
``protocol`` (their bodies), ``router`` (handlers, table rows, OpenAPI)."""
