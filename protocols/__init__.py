"""Sans-IO protocol logic: codecs, hashes, validation and state machines.

Nothing in this package performs I/O: no sockets, no trio, no Spark, no
files. Values and bytes in, values and bytes out.
"""
