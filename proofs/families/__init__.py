"""The theorem families, one module each, every one exposing ``obligations(max_n)``."""
