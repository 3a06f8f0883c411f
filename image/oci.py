#!/usr/bin/env python3
"""Packs a root filesystem into a one-layer OCI image archive, byte for byte reproducible.

No container daemon, no base image: the layer is a tar of ROOTFS in sorted order with every
owner 0 and every mtime SOURCE_DATE_EPOCH (default 0), gzip without a name or a time stamp, so
the same files give the same digest. The config's `created` is SOURCE_DATE_EPOCH too, when it is
set and not 0 (none rather than 1970). The archive imports with `ctr images import` (containerd
reads the `io.containerd.image.name` annotation) and is a valid OCI image layout. Prints the
manifest digest (what `ctr images ls` and the kubelet report) as the last line.

Usage: oci.py ROOTFS OUT.tar NAME:TAG [--arch ARCH] [--entrypoint PATH]... [--user UID:GID] [--env K=V]...
              [--label K=V]...
  ARCH is the OCI architecture of the files in ROOTFS (amd64, arm64); default: this machine's.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
import time

EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


def layer(rootfs):
    """The uncompressed layer tar: sorted, owner 0, fixed times, hard links kept."""
    buf = io.BytesIO()
    seen = {}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                path = os.path.join(dirpath, name)
                arc = os.path.relpath(path, rootfs)
                st = os.lstat(path)
                info = tarfile.TarInfo(arc)
                info.mode = stat.S_IMODE(st.st_mode)
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = EPOCH
                if stat.S_ISLNK(st.st_mode):
                    info.type = tarfile.SYMTYPE
                    info.linkname = os.readlink(path)
                    tar.addfile(info)
                elif stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif stat.S_ISREG(st.st_mode):
                    key = (st.st_dev, st.st_ino)
                    if st.st_nlink > 1 and key in seen:
                        info.type = tarfile.LNKTYPE
                        info.linkname = seen[key]
                        tar.addfile(info)
                        continue
                    seen[key] = arc
                    info.size = st.st_size
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    sys.exit(f"oci.py: {path}: only files, directories and symlinks belong in an image")
    return buf.getvalue()


def blob(blobs, data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("rootfs")
    p.add_argument("out")
    p.add_argument("name")
    p.add_argument("--entrypoint", action="append", default=[])
    p.add_argument("--cmd", action="append", default=[])
    p.add_argument("--user", default="0:0")
    p.add_argument("--arch", default={"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine))
    p.add_argument("--env", action="append", default=["PATH=/usr/local/bin:/usr/bin:/bin"])
    p.add_argument("--label", action="append", default=[], help="K=V in the config's Labels")
    a = p.parse_args()
    if ":" not in a.name.rsplit("/", 1)[-1]:
        sys.exit(f"oci.py: image name {a.name!r} has no tag")

    tar = layer(a.rootfs)
    gz = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz, mtime=0, compresslevel=6) as z:
        z.write(tar)
    blobs = {}
    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **blob(blobs, gz.getvalue())}
    config = {
        "architecture": a.arch,
        "os": "linux",
        "config": {"User": a.user, "Env": a.env, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()]},
    }
    if a.entrypoint:
        config["config"]["Entrypoint"] = a.entrypoint
    if a.cmd:
        config["config"]["Cmd"] = a.cmd
    if a.label:
        labels = dict(l.split("=", 1) for l in a.label if "=" in l)
        if "" in labels or len(labels) != len(a.label):
            sys.exit(f"oci.py: --label wants distinct KEY=VALUE, got {a.label!r}")
        config["config"]["Labels"] = labels
    if EPOCH:
        config["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH))
    config_desc = {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        **blob(blobs, json.dumps(config, sort_keys=True, separators=(",", ":")).encode()),
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    }
    manifest_desc = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **blob(blobs, json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()),
    }
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                **manifest_desc,
                "annotations": {
                    "io.containerd.image.name": a.name,
                    "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True, separators=(",", ":")).encode(),
    }
    for digest, data in blobs.items():
        files["blobs/sha256/" + digest.split(":")[1]] = data
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
            out.addfile(info)
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, EPOCH
            out.addfile(info, io.BytesIO(files[name]))
    os.replace(tmp, a.out)
    print(f"{a.name}: {len(gz.getvalue()) / 1e6:.1f} MB compressed, {len(tar) / 1e6:.1f} MB raw", file=sys.stderr)
    print(manifest_desc["digest"])


if __name__ == "__main__":
    main()
