"""The ports of a rig as a person reaches them: dev domains (``*.test``, ``*.localhost``) and their TLS."""
