"""The certified references: naive attention and its VJP over arb balls, and the same
enclosures in float64 with a closed-form rounding budget."""
