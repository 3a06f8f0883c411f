#!/usr/bin/env python3
"""Checks hack/krew.py on made-up tarballs, no network: the manifest names every platform with
its selector, release URL and the tarball's sha256; a missing platform, a tarball of another
version, one without the binary or LICENSE, a bad version or repo are each refused."""

import hashlib
import io
import pathlib
import sys
import tarfile
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import krew  # noqa: E402

VERSION = "1.2.3"
REPO = "example/groundskeeper"


def tarball(folder, name, members=("kubectl-groundskeeper", "LICENSE")):
    path = pathlib.Path(folder) / name
    with tarfile.open(path, "w:gz") as t:
        for m in members:
            data = f"made-up {m} of {name}\n".encode()
            info = tarfile.TarInfo(m)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def all_platforms(folder):
    return {
        (o, a): tarball(folder, krew.tarball_name(VERSION, o, a)) for o, a in krew.PLATFORMS
    }


class Krew(unittest.TestCase):
    def test_every_platform_with_its_url_and_sha256(self):
        with tempfile.TemporaryDirectory() as d:
            paths = all_platforms(d)
            digests = {k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in paths.items()}
            out = krew.manifest(VERSION, REPO, d)
        self.assertTrue(out.startswith("apiVersion: krew.googlecontainertools.github.com/v1alpha2\nkind: Plugin\n"))
        self.assertIn("  name: groundskeeper\n", out)
        self.assertIn("  version: v1.2.3\n", out)
        for (o, a), path in paths.items():
            digest = digests[(o, a)]
            block = (
                f"  - selector:\n      matchLabels:\n        os: {o}\n        arch: {a}\n"
                f"    uri: https://github.com/{REPO}/releases/download/v{VERSION}/{path.name}\n"
                f"    sha256: {digest}\n    bin: kubectl-groundskeeper\n"
            )
            self.assertIn(block, out)
        self.assertEqual(out.count("  - selector:"), 4)

    def refused(self, setup, version=VERSION, repo=REPO, says=""):
        with tempfile.TemporaryDirectory() as d:
            setup(d)
            with self.assertRaises(SystemExit) as e:
                krew.manifest(version, repo, d)
        self.assertIn(says, str(e.exception))

    def test_refusals(self):
        def missing(d):
            all_platforms(d)[("darwin", "arm64")].unlink()

        def other_version(d):
            all_platforms(d)
            tarball(d, krew.tarball_name("1.2.2", "linux", "amd64"))

        def no_binary(d):
            all_platforms(d)
            tarball(d, krew.tarball_name(VERSION, "linux", "arm64"), members=("LICENSE",))

        def no_license(d):
            all_platforms(d)
            tarball(d, krew.tarball_name(VERSION, "darwin", "amd64"), members=("kubectl-groundskeeper",))

        def not_gzip(d):
            all_platforms(d)
            (pathlib.Path(d) / krew.tarball_name(VERSION, "linux", "amd64")).write_text("nope")

        self.refused(missing, says="darwin_arm64.tar.gz: missing")
        self.refused(other_version, says="1.2.2_linux_amd64.tar.gz: not a tarball of version 1.2.3")
        self.refused(no_binary, says="no kubectl-groundskeeper")
        self.refused(no_license, says="no LICENSE")
        self.refused(not_gzip, says="not a gzipped tarball")
        self.refused(all_platforms, version="v1.2.3", says="not X.Y.Z")
        self.refused(all_platforms, repo="groundskeeper", says="not OWNER/NAME")


if __name__ == "__main__":
    unittest.main(verbosity=1)
