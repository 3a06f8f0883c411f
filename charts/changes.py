#!/usr/bin/env python3
"""Chart.yaml's `artifacthub.io/changes` annotation, built from CHANGELOG.md's section of the
chart's version: Artifact Hub's list of `{kind, description, links}`, one entry a bullet.

Usage: changes.py CHART_DIR [CHANGELOG]          writes the annotation into CHART_DIR/Chart.yaml
       changes.py --check CHART_DIR [CHANGELOG]  exits 1, saying what to run, when it is not current
       changes.py --print CHART_DIR [CHANGELOG]  prints the annotation's YAML
       --version X.Y.Z (with any of them)        X.Y.Z's section instead of Chart.yaml's `version`

CHANGELOG (default: the repository's CHANGELOG.md) keeps to Keep a Changelog: `## [VERSION]`
sections holding `### Added|Changed|Deprecated|Removed|Fixed|Security`, whose entries are `- `
bullets (wrapped lines indented; nested `  - ` bullets join their parent's entry). Every section
is read, not only the chart's: an unknown heading, or text in a `###` section outside a bullet,
is an error wherever it is, so it is found before the release that would publish it. A Markdown
link becomes its text, and an entry's link (to the repository's file at the version's tag when
relative). Only the standard library: the YAML written is a list of double-quoted strings,
folded at spaces, which any YAML parser reads back as the one-line description.
"""
import json
import os
import re
import sys
import textwrap

KINDS = {"Added": "added", "Changed": "changed", "Deprecated": "deprecated", "Removed": "removed",
         "Fixed": "fixed", "Security": "security"}
KEY = "artifacthub.io/changes"
VERSION = re.compile(r"^## \[([^\]]+)\]")
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
# `[0.1.0]: https://...` at the end of the file: the headings' link targets.
LINK_DEF = re.compile(r"^\[[^\]]+\]: ")


def parse(text, path):
    """{version: [(kind, text)]} in file order; each text is a bullet's lines joined."""
    sections, entries = {}, None
    kind, bullet = None, None

    def close():
        nonlocal bullet
        if bullet is not None:
            entries.append((kind, " ".join(bullet)))
        bullet = None

    for n, line in enumerate(text.split("\n"), 1):
        where = "%s:%d" % (path, n)
        if line.startswith("## "):
            if entries is not None:
                close()
            m = VERSION.match(line)
            if not m:
                raise SystemExit("%s: a version heading is `## [VERSION]`: %s" % (where, line))
            if m.group(1) in sections:
                raise SystemExit("%s: a second section [%s]" % (where, m.group(1)))
            entries = sections[m.group(1)] = []
            kind = None
        elif line.startswith("### "):
            if entries is None:
                raise SystemExit("%s: %s before any `## [VERSION]`" % (where, line))
            close()
            name = line[4:].strip()
            if name not in KINDS:
                raise SystemExit("%s: unknown heading %r: Artifact Hub's kinds are %s"
                                 % (where, name, ", ".join("### " + k for k in KINDS)))
            kind = KINDS[name]
        elif line.startswith("#"):
            if entries is not None:
                raise SystemExit("%s: only `## [VERSION]` and `### KIND` headings: %s" % (where, line))
        elif LINK_DEF.match(line):
            if entries is not None:
                close()
            entries, kind = None, None
        elif kind is None:
            continue  # the file's and a version's prose
        elif line.startswith("- "):
            close()
            bullet = [line[2:].strip()]
        elif line.startswith("  ") and line.strip():
            if bullet is None:
                raise SystemExit("%s: an indented line outside a bullet: %s" % (where, line))
            bullet.append(line.strip().removeprefix("- "))
        elif line.strip():
            raise SystemExit("%s: text in a `### ` section outside a `- ` bullet: %s" % (where, line))
    if entries is not None:
        close()
    return sections


def chart_field(chart_yaml, key):
    m = re.search(r"^%s: *\"?([^\"\n]*)\"?$" % key, chart_yaml, re.M)
    return m.group(1).strip() if m else ""


def quoted(text, indent, first):
    """A YAML double-quoted scalar, folded at spaces to fit 100 columns; `first` is what stands
    before it on its first line."""
    lines = textwrap.wrap(json.dumps(text, ensure_ascii=False), width=100 - indent,
                          initial_indent=" " * (len(first) - indent), break_long_words=False,
                          break_on_hyphens=False)
    lines[0] = first + lines[0].lstrip()
    return [lines[0]] + [" " * indent + line for line in lines[1:]]


def annotation(entries, home, version):
    """The annotation's value: its YAML lines, as written under `KEY: |` (4 spaces in)."""
    out = []
    for kind, text in entries:
        links = []
        for name, url in LINK.findall(text):
            if not re.match(r"https?://", url):
                url = "%s/blob/v%s/%s" % (home, version, url.lstrip("./"))
            if (name, url) not in links:
                links.append((name, url))
        description = LINK.sub(r"\1", text)
        out.append("    - kind: %s" % kind)
        out += quoted(description, 8, "      description: ")
        if links:
            out.append("      links:")
            for name, url in links:
                out.append("        - name: %s" % json.dumps(name, ensure_ascii=False))
                out.append("          url: %s" % url)
    return out


def generate(chart, changelog, version=None):
    chart_yaml = open(os.path.join(chart, "Chart.yaml")).read()
    sections = parse(open(changelog).read(), os.path.basename(changelog))
    version = version or chart_field(chart_yaml, "version")
    name = os.path.basename(changelog)
    if version not in sections:
        raise SystemExit("%s has no section [%s]: move the entries of [Unreleased] under `## [%s]`"
                         % (name, version, version))
    if not sections[version]:
        raise SystemExit("%s: section [%s] has no entries" % (name, version))
    return chart_yaml, annotation(sections[version], chart_field(chart_yaml, "home"), version)


def with_annotation(chart_yaml, lines):
    """Chart.yaml with KEY's block replaced, or added as the first annotation (charts/check.sh
    reads artifacthub.io/crdsExamples to the end of the file)."""
    block = "\n".join(["  %s: |" % KEY] + lines) + "\n"
    current = re.compile(r"^  %s: \|\n(?:    .*\n)*" % re.escape(KEY), re.M)
    if current.search(chart_yaml):
        return current.sub(lambda _: block, chart_yaml, count=1)
    if not re.search(r"^annotations:\n", chart_yaml, re.M):
        raise SystemExit("Chart.yaml has no `annotations:` map to add %s to" % KEY)
    return re.sub(r"^annotations:\n", lambda m: m.group(0) + block, chart_yaml, count=1, flags=re.M)


def main():
    args = sys.argv[1:]
    mode = args.pop(0) if args[:1] in (["--check"], ["--print"]) else None
    version = None
    if "--version" in args:
        i = args.index("--version")
        version = args[i + 1]
        del args[i:i + 2]
    if not 1 <= len(args) <= 2:
        raise SystemExit(__doc__)
    chart = args[0]
    changelog = args[1] if len(args) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "CHANGELOG.md")
    chart_yaml, lines = generate(chart, changelog, version)
    text = with_annotation(chart_yaml, lines)
    path = os.path.join(chart, "Chart.yaml")
    if mode == "--print":
        print("\n".join(line[4:] for line in lines))
    elif mode == "--check":
        if text != chart_yaml:
            print("FAIL: %s's %s is not CHANGELOG.md's [%s]: run `make chart-changes` and commit it"
                  % (path, KEY, version or chart_field(chart_yaml, "version")))
            return 1
        print("chart-changes: %s's %s is CHANGELOG.md's [%s]" % (path, KEY, version or chart_field(chart_yaml, "version")))
    else:
        with open(path, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
