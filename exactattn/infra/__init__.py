"""Process infrastructure: executors, the journal, progress, loading a user's code, and the
optional packages."""
