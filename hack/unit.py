#!/usr/bin/env python3
"""`make unit`: every test binary of the workspace, several at once.

`cargo test` runs its test binaries one after another, and most of the time goes to the cluster
tests, which mostly wait (on a lease to run out, a grace period, an apiserver restart) with each
binary's own throwaway control plane. Run side by side they share the cores without sharing
state: each binary starts its own etcd and kube-apiserver on ports of its own, its own network
namespaces and temporary folders.

Builds with `cargo test --no-run`, runs each test binary from its package's folder as cargo does
(the tests within a binary keep their own parallelism), longest first by the last run's
times, and prints each binary's output whole once it ends (as cargo would), then its outcome and
time. The doctests run first, with cargo. Exits 1 if anything failed.

    python3 hack/unit.py [--jobs N] [--alongside CMD] [-- cargo test arguments, e.g. -p X]
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def target_dir():
    return os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")


def build(cargo, extra):
    """The test executables cargo built: (name, executable, package folder, package name)."""
    cmd = [cargo, "test", "--no-run", "--message-format=json-render-diagnostics", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    found = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("profile", {}).get("test"):
            continue
        exe = msg.get("executable")
        if not exe:
            continue
        package = os.path.dirname(msg["manifest_path"])
        name = msg["target"]["name"]
        pkg = msg["package_id"]
        found.append((f"{os.path.basename(package)}/{name}", exe, package, pkg))
    return found


def timings_path():
    return os.path.join(target_dir(), "tmp", "unit-times.json")


def load_timings():
    try:
        with open(timings_path()) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save_timings(times):
    os.makedirs(os.path.dirname(timings_path()), exist_ok=True)
    with open(timings_path(), "w") as f:
        json.dump(times, f, indent=1, sort_keys=True)


def guess(name):
    """Before any recorded time: cluster and kernel tests are the long ones."""
    return 60.0 if ("cluster" in name or "kernel" in name) else 5.0


def run_one(entry, test_args):
    name, exe, package, _ = entry
    env = dict(os.environ, CARGO_MANIFEST_DIR=package)
    start = time.monotonic()
    try:
        with tempfile.TemporaryFile(mode="w+", errors="replace") as out:
            code = subprocess.call([exe, *test_args], cwd=package, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
            out.seek(0)
            text = out.read()
    except OSError as e:
        # A full disk, say: this binary failed, and the others still run and report.
        code, text = 1, f"unit: running {exe}: {e}"
    return name, code, time.monotonic() - start, text


def summary(text):
    for line in text.splitlines():
        if line.startswith("test result:"):
            return line[len("test result: "):]
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("GK_TEST_JOBS", "3")),
                    help="test binaries at once (GK_TEST_JOBS, default 3)")
    ap.add_argument("--alongside", metavar="CMD",
                    help="a shell command run (niced) while the tests run, once the build is done: "
                    "make test builds the release image so, in the time the cluster tests spend waiting")
    ap.add_argument("cargo_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cargo = os.environ.get("CARGO", "cargo")
    extra = [x for x in a.cargo_args if x != "--"] or ["--workspace"]
    os.makedirs(os.path.join(target_dir(), "tmp"), exist_ok=True)
    started = time.monotonic()
    entries = build(cargo, extra)
    failed = []
    # Doctests need cargo (rustdoc compiles them), and so does the command alongside: first.
    # (cargo takes --doc with no other choice of targets: then there are none to run.)
    targets = {"--lib", "--bins", "--bin", "--tests", "--test", "--benches", "--bench", "--examples", "--example"}
    if not targets & set(extra) and subprocess.call([cargo, "test", "--doc", *extra], cwd=ROOT) != 0:
        failed.append("doctests")
    alongside = None
    if a.alongside:
        print(f"unit: alongside the tests: {a.alongside}", flush=True)
        log = open(os.path.join(target_dir(), "tmp", "unit-alongside.log"), "w")
        alongside = subprocess.Popen(["nice", "-n", "19", "bash", "-c", a.alongside], cwd=ROOT,
                                     stdout=log, stderr=subprocess.STDOUT)
    times = load_timings()
    entries.sort(key=lambda e: -times.get(e[0], guess(e[0])))
    print(f"unit: {len(entries)} test binaries, {a.jobs} at once", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futures = {pool.submit(run_one, e, []): e for e in entries}
        for fut in concurrent.futures.as_completed(futures):
            name, code, took, text = fut.result()
            exe = futures[fut][1]
            times[name] = round(took, 1)
            verdict = "ok" if code == 0 else f"FAILED (exit {code})"
            # Each binary's own output whole, as `cargo test` prints it (libtest's "running N
            # tests", a line a test and "test result:"), in one block: CI and whoever reads the
            # log see every test that ran, not only a count.
            print(f"     Running {name} ({os.path.relpath(exe, ROOT)})", flush=True)
            print(text.rstrip("\n"), flush=True)
            print(f"unit: {name}: {verdict} in {took:.1f}s: {summary(text)}\n", flush=True)
            if code != 0:
                failed.append(name)
    save_timings(times)
    if alongside is not None:
        code = alongside.wait()
        if code != 0:
            print(f"unit: {a.alongside}: FAILED (exit {code}); its output:", flush=True)
            with open(os.path.join(target_dir(), "tmp", "unit-alongside.log")) as f:
                print(f.read()[-20000:])
            failed.append(a.alongside)
        else:
            print(f"unit: {a.alongside}: done", flush=True)
    took = time.monotonic() - started
    if failed:
        print(f"unit: FAILED: {', '.join(failed)} ({took:.0f}s)")
        return 1
    print(f"unit: all {len(entries)} test binaries and the doctests passed ({took:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
