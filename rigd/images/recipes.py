"""Where the image recipes live in the source tree (``images/``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rigd.errors import RigdError
from rigd.images.cache import repo_root


def read_packages(path: Path) -> list[str]:
    """A recipe's package list (``packages.txt``): one name per line, ``#`` comments."""
    out: list[str] = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    if not out:
        raise RigdError(f"{path}: lists no packages")
    return out


@dataclass(frozen=True, slots=True)
class Recipes:
    root: Path  # the checkout

    @classmethod
    def find(cls) -> Recipes:
        return cls(repo_root())

    @property
    def images(self) -> Path:
        return self.root / "images"

    @property
    def sources(self) -> Path:
        return self.images / "debian.sources"

    @property
    def kernel_lock(self) -> Path:
        return self.images / "kernel.lock"

    @property
    def busybox_lock(self) -> Path:
        return self.images / "busybox.lock"

    @property
    def initramfs_dir(self) -> Path:
        return self.images / "initramfs"

    @property
    def tools_dir(self) -> Path:
        return self.images / "tools"

    @property
    def runtime_lock(self) -> Path:
        return self.tools_dir / "runtime.lock"

    @property
    def terminal_dir(self) -> Path:
        return self.images / "terminal"

    @property
    def browser_dir(self) -> Path:
        """The browser image recipe, one image per engine (docs/images.md, "Browser image")."""
        return self.images / "browser"

    @property
    def desktop_dir(self) -> Path:
        """The computer (desktop) image recipe (docs/images.md, "Desktop image")."""
        return self.images / "desktop"

    @property
    def desktop_kernel_lock(self) -> Path:
        return self.desktop_dir / "kernel.lock"

    @property
    def agent(self) -> Path:
        """The real guest agent: the ``rigd_agent`` package (``guest-agent/rigd_agent/``, its
        port multiplexer included), carried by the tools disk as one zipapp."""
        return self.root / "guest-agent" / "rigd_agent"

    @property
    def standin_agent(self) -> Path:
        """Used only while ``guest-agent/rigd_agent/`` does not exist yet."""
        return self.tools_dir / "standin_agent.py"

    def agent_is_real(self) -> bool:
        return (self.agent / "__main__.py").is_file()

    def locks(self) -> list[tuple[Path, str | None]]:
        """Every lock file with the metapackage prefix ``pin`` follows (if any)."""
        return [
            (self.kernel_lock, "linux-image-"),
            (self.busybox_lock, None),
            (self.runtime_lock, None),
            (self.desktop_kernel_lock, "linux-image-"),
        ]
