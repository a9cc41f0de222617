"""What every proof family shares: obligations and their verdicts, the specification, the
library's symbolic runs, the zero test, exact terms, the SMT side and counterexamples."""
