"""collectives package."""
