"""Sans-I/O protocol cores: plain classes that take bytes and return events.

Nothing in this package imports trio or touches a socket, a file or a clock;
the async shells in ``rigd.backends`` own the I/O (see docs/STYLE notes:
h11 style).
"""
