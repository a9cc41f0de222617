"""What floating point costs: rigorous error bounds, the expected error, the error metrics, and
the low-bit schemes with their arithmetic."""
