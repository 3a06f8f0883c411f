#!/usr/bin/env python3
"""Fetches one pinned wheel from PyPI into DIR and checks its sha256; prints its path.

With pip when python3 has it (`pip download`, so pip's index, proxy and certificate settings
apply); without pip (a fresh Debian 12 has none) with the standard library alone, from the
index's JSON API (PEP 691, what pip itself reads; PIP_INDEX_URL is honoured). Either way the
file must match SHA256, so both paths give the same bytes.

Usage: wheel.py NAME VERSION FILENAME SHA256 DIR
  FILENAME is the wheel's exact file name (it names the platform for a binary wheel).
"""
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import urllib.request

INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def with_pip(name, version, filename, out):
    platform = filename[:-4].split("-")[-1].split(".")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--dest", out, f"{name}=={version}"]
    if platform != ["any"]:
        cmd += [arg for p in platform for arg in ("--platform", p)]
    subprocess.run(cmd, check=True)


def with_stdlib(name, version, filename, out):
    req = urllib.request.Request(f"{INDEX}/{name}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        files = json.load(r)["files"]
    match = [f for f in files if f["filename"] == filename]
    if not match:
        sys.exit(f"wheel.py: {INDEX}/{name}/ lists no {filename} (version {version})")
    with urllib.request.urlopen(match[0]["url"], timeout=300) as r, \
            open(os.path.join(out, filename), "wb") as f:
        while chunk := r.read(1 << 20):
            f.write(chunk)


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    name, version, filename, want, out = sys.argv[1:]
    os.makedirs(out, exist_ok=True)
    if importlib.util.find_spec("pip") is not None:
        with_pip(name, version, filename, out)
    else:
        print(f"wheel.py: no pip in {sys.executable}: fetching {filename} with urllib",
              file=sys.stderr)
        with_stdlib(name, version, filename, out)
    path = os.path.join(out, filename)
    if not os.path.exists(path):
        sys.exit(f"wheel.py: {filename} was not downloaded")
    got = sha256(path)
    if got != want:
        sys.exit(f"wheel.py: {filename}: sha256 {got}, expected {want}")
    print(path)


if __name__ == "__main__":
    main()
