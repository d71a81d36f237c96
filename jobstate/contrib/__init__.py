"""Integrations with other tools; each needs its extra installed."""
