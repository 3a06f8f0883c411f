#!/usr/bin/env python3
"""What an admin reads at install time says what the chart installs: NOTES.txt, printed by every
`helm install` and `helm upgrade`, and README.md's quick start.

Usage: notes_check.py HELM [CHART_DIR]

NOTES: rendered with `helm install --dry-run=client` (no cluster; `helm template` does not render
NOTES) for the defaults, each preset and the main mode switches, each held to the objects the same
render installs (the workloads' arguments, not the values, so NOTES and templates can not agree
on a mistake):
- "Running:" names exactly the components and parts that run (controllers, webhook, gate, tasks);
  no other text speaks of a component that does not run;
- a component in dry-run says so, one that is not does not;
- every URL's scheme is the admin servers' (--admin-scheme), the sysctl mode is theirs, and the
  kube-controller-manager controllers to turn off are the ones whose work ours does;
- the controller-manager's log is its leader's, found through the Lease's holderIdentity (with
  leader election on): never `kubectl logs deploy/...` or `ds/...`, which read whichever pod
  the API picks;
- no sentence says that something fails, rejects, evicts, kills or stops pods (nothing does);
- every kubectl command is one kubectl accepts, on kinds the cluster serves, with the release's
  namespace, names and labels (Services, ports, the Lease, selectors).

README.md: every `make TARGET` is a Makefile target, every value path (`controllerManager.dryRun`)
is in values.yaml, the release commands name the chart's version and the default Lease, and every
relative link reaches a file (and heading) that exists.
"""
import json
import os
import re
import shlex
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import docs  # noqa: E402  (values.yaml's parser)

NS = "groundskeeper"
PRESETS = os.path.join("presets", "managed-cluster.yaml")
# (release, helm arguments): the defaults, each preset, each mode switch.
CASES = [
    ("gk", []),
    ("groundskeeper", []),
    ("gk", ["-f", "{chart}/" + PRESETS]),
    ("gk", ["-f", "{chart}/ci/everything-on-values.yaml"]),
    ("gk", ["--set", "controllerManager.dryRun=true,nodeAgent.dryRun=true"]),
    ("gk", ["--set", "nodeAgent.dryRun=true"]),
    ("gk", ["--set", "controllerManager.dryRun=true,controllerManager.sysctlWebhook.gate.enabled=false"]),
    ("gk", ["--set", "metrics.scheme=http"]),
    ("gk", ["--set", "controllerManager.metricsAuth=none,nodeAgent.metricsAuth=none"]),
    ("gk", ["--set", "metrics.service.enabled=false"]),
    ("gk", ["--set", "controllerManager.enabled=false,metrics.scheme=http"]),
    ("gk", ["--set", "nodeAgent.enabled=false"]),
    ("gk", ["--set", "controllerManager.enabled=false,nodeAgent.sysctl.enabled=false"]),
    ("gk", ["--set", "controllerManager.sysctlWebhook.enabled=false"]),
    ("gk", ["--set", "controllerManager.sysctlWebhook.gate.enabled=false"]),
    ("gk", ["--set", "controllerManager.serviceCIDR.enabled=false"]),
    ("gk", ["--set", "controllerManager.podGC.enabled=false"]),
    ("gk", ["--set", "controllerManager.leaderElection.enabled=false,controllerManager.replicas=1"]),
    ("gk", ["--set", "nodeAgent.conntrack.enabled=false"]),
    ("gk", ["--set", "nodeAgent.sysctl.enabled=false"]),
    ("gk", ["--set", "nodeAgent.sysctl.defaultMode=Enforce"]),
    ("gk", ["--set", "namespace.create=true"]),
]
PODGC_ALL, PODGC_TTL = "PodGC", "PodGC (TTL and namespace policy only)"
TASKS = {"conntrack": "conntrack cleanup", "sysctl": "sysctl reports"}
KCM = {"servicecidr": "-service-cidr-controller", "podgc": "-pod-garbage-collector-controller"}
# What kubectl resolves without a cluster's help: built-in kinds, their short names, ours.
KINDS = {"pods", "pod", "po", "deploy", "deployment", "deployments", "ds", "daemonset", "daemonsets",
         "svc", "service", "services", "lease", "leases", "servicecidr", "servicecidrs", "ns",
         "namespace", "namespaces", "nodes", "node", "no", "events", "ipaddresses", "ipaddress",
         "sysctlpolicies", "sysctlpolicy", "sysctlpol"}
CLUSTER_KINDS = {"servicecidr", "servicecidrs", "ns", "namespace", "namespaces", "nodes", "node",
                 "no", "ipaddresses", "ipaddress", "sysctlpolicies", "sysctlpolicy", "sysctlpol"}
# kubectl's own flags NOTES may use, and whether each takes a value.
FLAGS = {"-n": True, "-l": True, "-o": True, "--field-selector": True, "--tail": True, "--overwrite": False}
POD_FIELDS = {"spec.nodeName", "metadata.name", "metadata.namespace", "status.phase"}
# Claims no component makes good: nothing fails, rejects, evicts, kills or stops a pod (the webhook
# keeps one off a node before it is bound; kubelet alone refuses what its allowlist forbids).
VERBS = r"(fail|fails|failed|reject|rejects|rejected|evict|evicts|evicted|kill|kills|killed|stop|stops|stopped)"
FALSE = [
    (re.compile(r"\blogs\s+(deploy|deployment|deployments|ds|daemonset|daemonsets)/"),
     "`kubectl logs TYPE/NAME` reads whichever pod the API picks (a standby's log, or one node's agent)"),
    (re.compile(r"\b%s\b[^.:;]{0,40}?\bpods?\b" % VERBS, re.I), "says something %s pods" % "fails/rejects/evicts/kills/stops"),
    (re.compile(r"\bpods?\b[^.:;]{0,40}?\b(is|are|be|get|gets|got)\s+%s\b" % VERBS, re.I), "says pods get failed/rejected/evicted/killed/stopped"),
]
NEGATION = re.compile(r"\b(never|no|not|nothing|none)\b", re.I)


class Obj:
    def __init__(self, doc):
        self.doc = doc
        self.kind = re.search(r"^kind: (\S+)$", doc, re.M).group(1)
        m = re.search(r"^metadata:\n(?:  .*\n)*?  name: \"?([^\"\n]+)\"?$", doc, re.M)
        self.name = m.group(1) if m else ""
        self.args = {}
        for key, value in re.findall(r"^ +- --([a-z0-9-]+)=(.*)$", doc, re.M):
            self.args.setdefault(key, value.strip("\"'"))
        template = doc.split("\n  template:\n", 1)
        self.pod_labels = dict(re.findall(r"^        ([\w./-]+): \"?([^\"\n]*)\"?$",
                                          template[1].split("\n    spec:\n", 1)[0], re.M)) if len(template) > 1 else {}
        self.ports = re.findall(r"^    - name: \S+\n      port: (\d+)$", doc, re.M) + re.findall(r"^  - port: (\d+)$", doc, re.M)
        self.ports += re.findall(r"^    - port: (\d+)$", doc, re.M)


def objects(manifest):
    return [Obj(d) for d in re.split(r"^---$", manifest, flags=re.M) if re.search(r"^kind: ", d, re.M)]


def render(helm, chart, release, args):
    args = [a.replace("{chart}", chart) for a in args]
    cmd = [helm, "install", release, chart, "-n", NS, "--dry-run=client", "-o", "json"] + args
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("FAIL: %s: %s" % (" ".join(cmd), p.stderr.strip()))
    return json.loads(p.stdout)


def running(notes):
    """{component: [parts]} from the "Running:" block."""
    block = notes.split("\nRunning:\n", 1)
    if len(block) < 2:
        return None
    out = {}
    for line in block[1].split("\n\n", 1)[0].split("\n"):
        m = re.match(r"^  ([a-z-]+) \(.*\): (.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).split(", ")
        elif line.strip() and not line.startswith("  nothing: "):
            out.setdefault("?", []).append(line)
    return out


def commands(notes):
    """Every shell command line of NOTES, as shlex tokens, with each "$(...)" inside it too."""
    out = []

    def add(tokens):
        for segment in split_pipes(tokens):
            out.append(segment)
            for t in segment:
                if t.startswith("$(") and t.endswith(")"):
                    add(shlex.split(t[2:-1], comments=True))

    for line in notes.split("\n"):
        s = line.strip()
        if s.startswith(("kubectl ", "helm ", "curl ", "kube-controller-manager ")):
            add(shlex.split(s, comments=True))
    return out


def split_pipes(tokens):
    segments, cur = [], []
    for t in tokens:
        if t == "|":
            segments.append(cur)
            cur = []
        else:
            cur.append(t)
    return segments + [cur]


class Case:
    def __init__(self, label, release, data):
        self.label, self.release = label, release
        self.notes = data["info"]["notes"]
        self.objs = objects(data["manifest"])
        self.hooks = data.get("hooks") or []
        self.problems = []

    def fail(self, what):
        self.problems.append(what)

    def first(self, kind):
        return next((o for o in self.objs if o.kind == kind), None)

    def check(self):
        notes, cm, na = self.notes, self.first("Deployment"), self.first("DaemonSet")
        gate = self.first("MutatingWebhookConfiguration") is not None
        controllers = cm.args.get("controllers", "").split(",") if cm else []
        webhook = bool(cm) and cm.args.get("sysctl-webhook") == "true"
        tasks = na.args.get("tasks", "").split(",") if na else []

        # Running: exactly what runs.
        want = {}
        if cm:
            parts = ["ServiceCIDR controller"] if "servicecidr" in controllers else []
            if "podgc" in controllers:
                parts.append(PODGC_ALL if cm.args.get("pod-gc-mode") == "all" else PODGC_TTL)
            parts += ["sysctl webhook"] if webhook else []
            parts += ["sysctl scheduling gate"] if gate else []
            want["controller-manager"] = parts
        if na:
            want["node-agent"] = [TASKS[t] for t in tasks]
        have = running(notes)
        if have is None:
            self.fail("no \"Running:\" block")
        elif {k: sorted(v) for k, v in have.items()} != {k: sorted(v) for k, v in want.items()}:
            self.fail("\"Running:\" says %s; the render runs %s" % (have, want))
        if not cm and re.search(r"(?<!kube-)controller-manager", notes):
            self.fail("speaks of the controller-manager, which is not installed")
        if not na and "node-agent" in notes:
            self.fail("speaks of the node-agent, which is not installed")
        if "servicecidr" not in controllers and re.search(r"\bservicecidrs?\b", notes):
            self.fail("shows ServiceCIDR commands, but the ServiceCIDR controller is not ours here")
        if not gate and "scheduling gate" in notes:
            self.fail("speaks of the scheduling gate, which is not installed")

        # Dry run, per component.
        for name, obj in (("controller-manager", cm), ("node-agent", na)):
            on = bool(obj) and obj.args.get("dry-run") == "true"
            said = ("DRY RUN (%s)" % name) in notes
            if on != said:
                self.fail("%s is %sin dry-run, NOTES %s" % (name, "" if on else "not ", "do not say so" if on else "say it is"))

        # Schemes, modes, what to turn off in kube-controller-manager.
        scheme = (cm or na).args.get("admin-scheme") if (cm or na) else None
        urls = re.findall(r"\b(https?)://localhost", notes)
        if any(u != scheme for u in urls):
            self.fail("URLs use %s, the admin servers serve %s" % (sorted(set(urls)), scheme))
        if self.first("Service") and any(o.name.endswith("-metrics") for o in self.objs if o.kind == "Service") and not urls:
            self.fail("metrics Services are installed and NOTES show no /metrics URL")
        mode = (cm and cm.args.get("sysctl-default-mode")) or (na and na.args.get("sysctl-default-mode"))
        if webhook or "sysctl" in tasks:
            if ("are in %s mode." % (mode or "").capitalize()) not in notes:
                self.fail("does not state the sysctl default mode %s" % mode)
        elif "Sysctl policy:" in notes:
            self.fail("speaks of sysctl policy, but neither the webhook nor the sysctl reports run")
        if not webhook and "kept off" in notes:
            self.fail("says pods are kept off nodes, but no webhook runs")
        off = re.search(r"^kube-controller-manager --controllers=\*,(\S+)$", notes, re.M)
        want_off = [KCM[c] for c in ("servicecidr", "podgc") if c in controllers
                    and (c != "podgc" or cm.args.get("pod-gc-mode") == "all")]
        if (off.group(1).split(",") if off else []) != want_off:
            self.fail("kube-controller-manager controllers to turn off: NOTES %s, ours run %s" % (off and off.group(1), want_off))

        # The leader's log.
        lease = cm.args.get("leader-elect-lease-name") if cm and cm.args.get("leader-elect") == "true" else None
        if lease:
            pattern = r'logs "\$\(kubectl -n %s get lease %s -o jsonpath=\'\{\.spec\.holderIdentity\}\' \| cut -d_ -f1\)"' % (NS, re.escape(lease))
            if not re.search(pattern, notes):
                self.fail("does not show the leader's log through Lease %s's holderIdentity" % lease)
        elif re.search(r"\blease\b", notes):
            self.fail("speaks of a Lease, but leader election is off")

        # helm test only where there is one.
        tested = any("test" in h.get("events", []) for h in self.hooks)
        if tested != bool(re.search(r"^  helm test %s -n %s\b" % (re.escape(self.release), NS), notes, re.M)):
            self.fail("helm test is %srendered, NOTES %s" % ("" if tested else "not ", "do not show it" if tested else "show it"))

        # Sentences that are false of the product.
        for sentence in re.split(r"(?<=[.:;])\s+|\n\n", notes):
            for pattern, why in FALSE:
                for m in pattern.finditer(sentence):
                    if pattern is FALSE[0][0] or not NEGATION.search(sentence[:m.start()]):
                        self.fail("%s: %r" % (why, sentence.strip()))

        for role in re.findall(r"\bClusterRole ([a-z0-9.-]*[a-z0-9])", notes):
            if not any(o.kind == "ClusterRole" and o.name == role for o in self.objs):
                self.fail("names ClusterRole %s, which is not installed" % role)

        for tokens in commands(notes):
            if tokens and tokens[0] == "kubectl":
                self.kubectl(tokens[1:], cm, na)

    def kubectl(self, tokens, cm, na):
        cmd = "kubectl " + " ".join(tokens)
        flags, pos, i = {}, [], 0
        while i < len(tokens):
            t = tokens[i]
            key, eq, value = t.partition("=") if t.startswith("--") else (t, "", "")
            if key in FLAGS:
                if FLAGS[key] and not eq:
                    if i + 1 >= len(tokens):
                        return self.fail("%s: %s without a value" % (cmd, key))
                    value, i = tokens[i + 1], i + 1
                flags[key] = value
            elif t.startswith("-"):
                return self.fail("%s: a flag NOTES do not use: %s" % (cmd, t))
            else:
                pos.append(t)
            i += 1
        if not pos:
            return self.fail("%s: no verb" % cmd)
        verb, args = pos[0], pos[1:]
        if "-n" in flags and flags["-n"] != NS:
            self.fail("%s: namespace %s, the release's is %s" % (cmd, flags["-n"], NS))
        for label in flags.get("-l", "").split(",") if "-l" in flags else []:
            key, _, value = label.partition("=")
            pods = [o for o in (cm, na) if o and o.pod_labels.get(key) == value]
            if not pods:
                self.fail("%s: no pod the chart installs has the label %s" % (cmd, label))
        if "--field-selector" in flags and flags["--field-selector"].partition("=")[0] not in POD_FIELDS:
            self.fail("%s: pods have no field selector %s" % (cmd, flags["--field-selector"]))
        out = flags.get("-o")
        if out is not None and not (out in ("name", "wide", "yaml", "json") or out.startswith("custom-columns=")
                                    or (out.startswith("jsonpath=") and out.count("{") == out.count("}"))):
            self.fail("%s: not an output kubectl has: -o %s" % (cmd, out))

        def namespaced(kind):
            if kind not in CLUSTER_KINDS and "-n" not in flags:
                self.fail("%s: %s is namespaced and the command names no namespace" % (cmd, kind))

        if verb == "get":
            if not args:
                return self.fail("%s: get what?" % cmd)
            kinds = args[0].split(",")
            for kind in kinds:
                if kind not in KINDS:
                    self.fail("%s: no resource type %s" % (cmd, kind))
                namespaced(kind)
            if kinds[0] in ("lease", "leases"):
                lease = cm.args.get("leader-elect-lease-name") if cm else None
                if args[1:] != [lease]:
                    self.fail("%s: the Lease is %s" % (cmd, lease))
        elif verb == "logs":
            if "-l" in flags and not args:
                pass
            elif len(args) != 1 or not args[0].startswith("$("):
                self.fail("%s: logs of one pod found by name (a Lease's holder, a node's agent), or by label" % cmd)
        elif verb == "port-forward":
            kind, _, name = args[0].partition("/") if args else ("", "", "")
            svc = next((o for o in self.objs if o.kind == "Service" and o.name == name), None)
            if kind not in ("svc", "service") or svc is None:
                self.fail("%s: no Service %s is installed" % (cmd, name))
            elif args[1:] and args[1].split(":")[-1] not in svc.ports:
                self.fail("%s: Service %s has no port %s (%s)" % (cmd, name, args[1], svc.ports))
        elif verb == "label":
            if args[:2] != ["namespace", NS] or len(args) != 3 or "=" not in args[2]:
                self.fail("%s: label namespace %s KEY=VALUE" % (cmd, NS))
        elif verb == "groundskeeper":
            if args[:2] not in (["why", "servicecidr"], ["why", "pod"]) and args[:2] != ["sysctl", "check"]:
                self.fail("%s: the plugin has why servicecidr|pod and sysctl check" % cmd)
        else:
            self.fail("%s: a verb NOTES do not use: %s" % (cmd, verb))


def check_notes(helm, chart):
    failed = 0
    for release, args in CASES:
        label = "%s %s" % (release, " ".join(args).replace("{chart}/", "") or "(defaults)")
        case = Case(label, release, render(helm, chart, release, args))
        case.check()
        for p in case.problems:
            print("FAIL: NOTES (%s): %s" % (label, p))
        failed += bool(case.problems)
    if failed:
        return 1
    print("notes: NOTES.txt holds to what the chart installs, in %d renders" % len(CASES))
    return 0


def slug(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def check_readme(chart):
    readme = os.path.join(ROOT, "README.md")
    text = open(readme).read()
    problems = []
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    targets = {t for line in re.findall(r"^([a-z][a-z0-9 -]*):(?!=)", makefile, re.M) for t in line.split()}
    code = re.findall(r"```[a-z]*\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    values = docs.parse_values(open(os.path.join(chart, "values.yaml")).read())
    paths, stack = set(), [values]
    while stack:
        e = stack.pop()
        paths.add(".".join(e.path))
        stack += e.children
    chart_yaml = open(os.path.join(chart, "Chart.yaml")).read()
    version = docs.chart_field(chart_yaml, "version")
    lease = re.search(r"^    leaseName: (\S+)$", open(os.path.join(chart, "values.yaml")).read(), re.M).group(1)
    for snippet in code:
        for target in re.findall(r"(?:^|\s|`)make ([a-z][a-z0-9-]*)", snippet):
            if target not in targets:
                problems.append("`make %s`: no such Makefile target" % target)
        for path in re.findall(r"\b((?:global|image|namespace|podSecurity|controllerManager|nodeAgent|networkPolicy|tests|metrics|crds|rbac)(?:\.[A-Za-z][A-Za-z0-9]*)+)", snippet):
            if path not in paths:
                problems.append("%s: no such value in values.yaml" % path)
        for m in re.finditer(r"--version (\S+)", snippet):
            if m.group(1) != version:
                problems.append("installs --version %s, the chart is %s" % (m.group(1), version))
        for m in re.finditer(r"get lease (\S+)", snippet):
            if m.group(1) != lease:
                problems.append("reads Lease %s, the chart's default is %s" % (m.group(1), lease))
        for path in re.findall(r"(?<![/\w])((?:charts|docs|hack|crds)/[\w./-]+)", snippet):
            if not os.path.exists(os.path.join(ROOT, path.rstrip("."))):
                problems.append("%s: no such file" % path)
    for target in re.findall(r"\]\(([^)#:\s]+)(?:#([^)\s]+))?\)", text):
        path, anchor = target
        full = os.path.join(ROOT, path)
        if not os.path.exists(full):
            problems.append("link to %s: no such file" % path)
        elif anchor and full.endswith(".md"):
            headings = {slug(h) for h in re.findall(r"^#+ (.*)$", open(full).read(), re.M)}
            if anchor not in headings:
                problems.append("link to %s#%s: no such heading" % (path, anchor))
    for p in problems:
        print("FAIL: README.md: %s" % p)
    if problems:
        return 1
    print("notes: README.md's commands name Makefile targets, values, files and headings that exist")
    return 0


def main():
    if not 1 <= len(sys.argv) - 1 <= 2:
        raise SystemExit(__doc__)
    helm = sys.argv[1]
    chart = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "groundskeeper"))
    return check_notes(helm, chart) | check_readme(chart)


if __name__ == "__main__":
    sys.exit(main())
