"""Test support that ships with omnix (never used by the product path)."""
