"""Beam pipelines: composite PTransforms over prism_core, and the hourly run."""
