"""The `traceq` command line: thin click commands over the library."""
