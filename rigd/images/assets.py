"""The finished assets a terminal rig boots from (returned by ``build_all``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class TerminalAssets:
    kernel: Path  # the uncompressed ELF vmlinux (PVH boot)
    initrd: Path  # the uncompressed newc initramfs
    tools: Path  # tools.img: raw ext4, attached read-only, mounted at /.rigd
    oci_layout: Path  # the default terminal image as an OCI layout
    image_digest: str  # "sha256:<hex>" of its manifest
    kernel_release: str  # e.g. "6.1.0-57-cloud-amd64"
