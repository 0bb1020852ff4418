"""Module load order for the initramfs, resolved at build time."""

from __future__ import annotations

import pytest

from rigd.errors import RigdError
from rigd.images.initramfs import ModuleIndex, entries

DEP = """\
kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/hw_random/virtio-rng.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/lib/libcrc32c.ko:
kernel/crypto/crc32c_generic.ko:
"""
BUILTIN = "kernel/fs/ext4/ext4.ko\nkernel/fs/jbd2/jbd2.ko\n"
SOFT = "softdep libcrc32c pre: crc32c\nsoftdep ksmbd pre: crc32\n"


def index() -> ModuleIndex:
    return ModuleIndex.parse(DEP, BUILTIN, SOFT)


def test_dependencies_load_first_and_once() -> None:
    order = index().load_order(["virtio_mmio", "virtio_blk", "virtio-rng"])
    names = [p.rsplit("/", 1)[1] for p in order]
    assert names.index("virtio.ko") < names.index("virtio_mmio.ko")
    assert names.index("virtio_ring.ko") < names.index("virtio_blk.ko")
    assert len(names) == len(set(names)) == 5
    assert names[-1] == "virtio-rng.ko"


def test_builtins_are_skipped() -> None:
    assert index().load_order(["ext4"]) == []


def test_soft_pre_dependencies_are_followed_when_present() -> None:
    # "crc32c" is an alias that no module file carries: optional, skipped.
    assert index().load_order(["libcrc32c"]) == ["kernel/lib/libcrc32c.ko"]


def test_unknown_module_is_an_error() -> None:
    with pytest.raises(RigdError, match="virtio_gpu"):
        index().load_order(["virtio_gpu"])


def test_archive_has_console_node_applets_and_order_file() -> None:
    members = {
        e.path: e
        for e in entries(init=b"#!/bin/sh\n", busybox=b"BB", modules=[("a.ko", b"A"), ("b.ko", b"B")])
    }
    assert members["dev/console"].rdev == (5, 1)
    assert members["bin/switch_root"].data == b"busybox"
    assert members["etc/rigd-modules"].data == b"a.ko\nb.ko\n"
    assert members["lib/modules/b.ko"].data == b"B"
