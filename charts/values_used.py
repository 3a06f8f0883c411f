#!/usr/bin/env python3
"""Every value the chart accepts is used: each leaf of values.schema.json (a key without
"properties" of its own: a scalar, a list, or a free-form map) must be read by some template, so
that a value the schema accepts is never silently ignored.

Usage: values_used.py CHART_DIR. Prints each unread leaf and exits 1 when there is one.

"Read" is decided statically, from the templates' text: a reference `.Values.a.b`,
`$.Values.a.b`, a variable bound to one (`$cm := .Values.controllerManager`, then `$cm.x`), a
field of a `with` block's value, or a field of the argument a helper is included with
(`include "h" $cm` then `.x` in the helper; `(dict "k" $cm)` then `.k.x`; `(list $ "c" $sa)` then
`index . 2`). A map handed over whole (toYaml, toJson, range, omit, join) reads all its keys.
Only the standard library: it runs wherever the chart checks run.
"""
import json
import os
import re
import sys

ACTION = re.compile(r"{{-?(.*?)-?}}", re.S)
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# A reference: a root (.Values, $.Values, .ctx.Values, $var, or . alone) and its field chain.
REF = re.compile(r"(\(index \. (\d)\)|\$" + IDENT + r"|\$|\.ctx\.Values|\.Values|(?=\.))((?:\." + IDENT + r")*)(\.?)")
BUILTIN_FIELDS = {"Release", "Chart", "Capabilities", "Template", "Files", "ctx"}


def schema_leaves(node, path=()):
    props = node.get("properties")
    if not props:
        yield ".".join(path)
        return
    for key, child in props.items():
        yield from schema_leaves(child, path + (key,))


class Scope:
    """What `.` and each variable stand for: a values path ("Values.a.b"), a helper-relative
    path ("@.k.x", resolved where the helper is included), or None (anything else)."""

    def __init__(self, dot):
        self.dot = dot
        self.vars = {"$": "ROOT"}
        self.stack = []


def join(base, fields):
    if base is None:
        return None
    if base.startswith("ROOT.") or base.startswith("ROOT["):
        base, fields = "ROOT", base[len("ROOT"):] + fields
    if base == "ROOT":
        if not fields.startswith(".Values"):
            return None
        return "Values" + fields[len(".Values"):]
    return base + fields


def resolve(scope, m):
    root, index, fields = m.group(1), m.group(2), m.group(3)
    if index is not None:
        base = join(scope.dot, "[%s]" % index) if scope.dot not in (None, "ROOT") else ("ROOT" if index == "0" else None)
        return join(base, fields)
    if root in (".Values", ".ctx.Values"):
        return "Values" + fields
    if root == "$":
        return join("ROOT", fields) if fields else "ROOT"
    if root.startswith("$"):
        return join(scope.vars.get(root), fields)
    # `.` or `.field...`; `.ctx` is the root by the helpers' convention.
    first = fields.split(".")[1] if fields else ""
    if first == "ctx" and scope.dot == "@":
        return "@.ctx"
    if first in BUILTIN_FIELDS:
        return None
    return join(scope.dot, fields)


def refs_in(scope, text):
    out = []
    for m in REF.finditer(text):
        # `.Values` inside `$.Values...` is matched from the `$`; skip fragments of strings.
        if m.group(0) == "" or (m.start() > 0 and re.match(r"[A-Za-z0-9_\"'%)]", text[m.start() - 1])):
            continue
        p = resolve(scope, m)
        if p is not None:
            out.append((p, m))
    return out


def handed_over_whole(act, m, kw):
    """True when the reference is the argument of a function that reads every key of it."""
    before = act[: m.start()].rstrip()
    after = act[m.end():].lstrip()
    if re.search(r'(\b(toYaml|toJson|omit)|\bjoin\s+"[^"]*"|\bhas\s+\S+)\s*\(?$', before):
        return True
    if kw == "range" and re.search(r"(^range|:=)$", before):
        return True
    return bool(re.match(r"\|\s*(toYaml|toJson)\b", after))


def include_args(scope, arg):
    """Maps a helper's "@..." to values paths for one include argument."""
    arg = arg.strip()
    if arg.startswith("(dict"):
        mapping = {}
        for key, ref in re.findall(r'"(\w+)"\s+(\(index \. \d\)(?:\.\w+)*|[$.][\w.$]*)', arg):
            m = REF.fullmatch(ref)
            p = resolve(scope, m) if m else None
            if p is not None:
                mapping["@." + key] = p
        return mapping
    if arg.startswith("(list"):
        mapping = {}
        for i, tok in enumerate(arg[len("(list"):].rstrip(")").split()):
            m = REF.fullmatch(tok)
            p = resolve(scope, m) if m else None
            if p is not None:
                mapping["@[%d]" % i] = p
        return mapping
    m = REF.match(arg)
    p = resolve(scope, m) if m else None
    return {"@": p} if p is not None else {}


def scan(chart):
    used, whole = set(), set()
    helper_used, helper_whole = {}, {}  # define name -> set of "@..." paths
    includes = []  # (define name, mapping)
    tdir = os.path.join(chart, "templates")
    files = []
    for d, _, names in os.walk(tdir):
        files += [os.path.join(d, n) for n in names]
    for f in sorted(files):
        text = open(f).read()
        scope = Scope("ROOT")
        define = None
        for a in ACTION.finditer(text):
            act = a.group(1).strip()
            if act.startswith("/*"):
                continue
            kw = act.split()[0] if act.split() else ""
            if kw == "define":
                define = re.match(r'define\s+"([^"]+)"', act).group(1)
                scope = Scope("@")
                scope.stack.append(("define", None))
                continue
            if kw == "end":
                if scope.stack:
                    kind, saved = scope.stack.pop()
                    if kind == "define":
                        define, scope = None, Scope("ROOT")
                    elif kind == "with":
                        scope.dot = saved
                continue
            found = refs_in(scope, act)
            for p, m in found:
                is_whole = handed_over_whole(act, m, kw)
                target_used = helper_used.setdefault(define, set()) if define and p.startswith("@") else used
                target_whole = helper_whole.setdefault(define, set()) if define and p.startswith("@") else whole
                target_used.add(p)
                if is_whole:
                    target_whole.add(p)
            for name, arg in re.findall(r'include\s+"([^"]+)"\s+(\((?:dict|list)[^()]*(?:\([^()]*\)[^()]*)*\)|[$.][\w.$]*)', act):
                includes.append((name, include_args(scope, arg)))
            assign = re.match(r"(\$" + IDENT + r")\s*:?=\s*(.*)", act)
            if assign:
                rhs = assign.group(2).strip()
                m = REF.match(rhs)
                p = resolve(scope, m) if m and m.start() == 0 else None
                if rhs.startswith("index . "):
                    p = join(scope.dot, "[%s]" % rhs.split()[2])
                if rhs.startswith("(") and not rhs.startswith("(index"):
                    p = None
                scope.vars[assign.group(1)] = p
            if kw in ("if", "range", "with", "block"):
                saved = scope.dot
                if kw == "with":
                    m = REF.match(act[len("with"):].strip())
                    scope.dot = resolve(scope, m) if m else None
                scope.stack.append((kw if kw == "with" else "block", saved))
    # Resolve helpers' relative paths at every include site.
    for name, mapping in includes:
        for rel_set, target in ((helper_used.get(name, ()), used), (helper_whole.get(name, ()), whole)):
            for rel in rel_set:
                for key in sorted(mapping, key=len, reverse=True):
                    if rel == key or rel.startswith(key + ".") or rel.startswith(key + "["):
                        p = join(mapping[key], rel[len(key):])
                        if p is not None:
                            target.add(p)
                        break
    return used, whole


def main():
    chart = sys.argv[1]
    schema = json.load(open(os.path.join(chart, "values.schema.json")))
    used, whole = scan(chart)
    unread = []
    for leaf in schema_leaves(schema):
        path = "Values." + leaf
        parts = path.split(".")
        ancestors = {".".join(parts[:i]) for i in range(2, len(parts))}
        if path in used or ancestors & whole:
            continue
        unread.append(leaf)
    for leaf in unread:
        print("FAIL: values.schema.json accepts %s, which no template reads (use it, or remove it from values.yaml and the schema)" % leaf)
    return 1 if unread else 0


if __name__ == "__main__":
    sys.exit(main())
