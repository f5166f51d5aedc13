"""HTTP server for remote trainers (to come: issue 5)."""
