"""``GET /v1/files/{digest}``: the image files ``url`` answers point to."""
