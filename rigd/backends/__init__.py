"""Backends boot and drive machines. ``base`` holds the one small interface;
``smolvm`` implements terminal rigs on QEMU microVMs."""
