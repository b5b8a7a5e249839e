"""The command line: the window's options, `demo` and `bench`."""
