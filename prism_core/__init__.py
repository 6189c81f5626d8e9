"""Prism algorithms: pure functions on Arrow tables and numpy arrays."""
