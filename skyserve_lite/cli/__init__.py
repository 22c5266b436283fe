"""The `sky-lite` command line."""
