"""The `prism` command line."""
