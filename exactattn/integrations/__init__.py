"""Adapters that plug exactattn into other libraries (each imports its library on demand)."""
