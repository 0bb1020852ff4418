"""Backends boot and drive machines. ``base`` holds the one small interface
(``Machine``); ``qemu`` the one QEMU machine every surface runs on, with a recipe and a
driver per surface: ``smolvm`` (terminal rigs on microVMs), ``desktop`` (computer rigs on
q35 with XFCE), ``browser`` (browser rigs: a microVM and its engine). ``host`` is the
backend the server uses; ``warm`` and ``snapshot`` the warm starts; ``gates`` the
egress gateways (netgate); ``fake`` serves unit tests."""
