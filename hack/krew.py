#!/usr/bin/env python3
"""The krew manifest of a release (kubectl krew install --manifest=groundskeeper.krew.yaml).

Usage: krew.py --version X.Y.Z --repo OWNER/NAME DIR > groundskeeper.krew.yaml

DIR holds the plugin's tarballs, kubectl-groundskeeper_X.Y.Z_OS_ARCH.tar.gz, one for each of
PLATFORMS and no other; each must hold kubectl-groundskeeper and LICENSE at its top. Each
platform's entry names its tarball's release URL and sha256. Standard library only. A missing,
unexpected, or incomplete tarball is refused in one line naming it (exit 1).
"""

import argparse
import hashlib
import pathlib
import re
import sys
import tarfile

PLATFORMS = [("linux", "amd64"), ("linux", "arm64"), ("darwin", "amd64"), ("darwin", "arm64")]
BIN = "kubectl-groundskeeper"
NEEDED = [BIN, "LICENSE"]


def tarball_name(version, os_, arch):
    return f"{BIN}_{version}_{os_}_{arch}.tar.gz"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_tarball(path):
    try:
        with tarfile.open(path, "r:gz") as t:
            names = {m.name.removeprefix("./") for m in t.getmembers() if m.isfile()}
    except (tarfile.TarError, OSError) as e:
        raise SystemExit(f"krew.py: {path.name}: not a gzipped tarball ({e})")
    missing = [n for n in NEEDED if n not in names]
    if missing:
        raise SystemExit(f"krew.py: {path.name}: no {', '.join(missing)} at its top")


def manifest(version, repo, folder):
    folder = pathlib.Path(folder)
    if not re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", version):
        raise SystemExit(f"krew.py: version {version!r} is not X.Y.Z (no leading v)")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo):
        raise SystemExit(f"krew.py: repo {repo!r} is not OWNER/NAME")
    expected = {tarball_name(version, o, a) for o, a in PLATFORMS}
    present = {p.name for p in folder.glob(f"{BIN}_*.tar.gz")}
    extra = sorted(present - expected)
    if extra:
        raise SystemExit(f"krew.py: {', '.join(extra)}: not a tarball of version {version} for {PLATFORMS}")
    lines = [
        "apiVersion: krew.googlecontainertools.github.com/v1alpha2",
        "kind: Plugin",
        "metadata:",
        "  name: groundskeeper",
        "spec:",
        f"  version: v{version}",
        f"  homepage: https://github.com/{repo}",
        "  shortDescription: Why a ServiceCIDR's deletion waits, why PodGC took a pod",
        "  description: |",
        "    Answers an admin's why from the API alone, with groundskeeper's own decision code:",
        "    what blocks a ServiceCIDR's deletion (get servicecidrs, why servicecidr), whether",
        "    PodGC collected a pod and by which pass (why pod), and a node's sysctl verdict on a",
        "    manifest (sysctl check). Reads only: gets and lists.",
        "  platforms:",
    ]
    for os_, arch in PLATFORMS:
        name = tarball_name(version, os_, arch)
        path = folder / name
        if not path.is_file():
            raise SystemExit(f"krew.py: {name}: missing from {folder}")
        check_tarball(path)
        lines += [
            "  - selector:",
            "      matchLabels:",
            f"        os: {os_}",
            f"        arch: {arch}",
            f"    uri: https://github.com/{repo}/releases/download/v{version}/{name}",
            f"    sha256: {sha256(path)}",
            f"    bin: {BIN}",
            "    files:",
            f"    - from: {BIN}",
            "      to: .",
            "    - from: LICENSE",
            "      to: .",
        ]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--version", required=True, help="X.Y.Z, the tag without its v")
    p.add_argument("--repo", required=True, help="OWNER/NAME on GitHub")
    p.add_argument("folder")
    a = p.parse_args()
    sys.stdout.write(manifest(a.version, a.repo, a.folder))


if __name__ == "__main__":
    main()
