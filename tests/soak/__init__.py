"""The chaos soak (issue 14)."""
