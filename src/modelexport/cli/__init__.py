"""The command-line interface: a thin layer over the library API."""
