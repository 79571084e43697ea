"""``POST /v1/chat/completions``: ``protocol`` (its bodies), ``plan`` (a
body -> the requests it submits), ``render`` (events -> its bytes),
``router`` (its handler, table row and OpenAPI description)."""
