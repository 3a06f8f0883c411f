# groundskeeper: the two commands a newcomer needs are `make run` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
TOOLS := $(CURDIR)/.tools/bin
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
HELM := $(TOOLS)/helm
KUBECTL ?= $(shell command -v kubectl 2>/dev/null || echo $(TOOLS)/kubectl)

# `make run` works against the current kube context, from this machine: destructive actions
# are logged, not made, unless you say DRY_RUN=false.
DRY_RUN ?= true
NODE_NAME ?= $(shell $(KUBECTL) get nodes -o jsonpath='{.items[0].metadata.name}' 2>/dev/null)

.PHONY: all build run test fmt lint unit chart-check tools crds bench clean

all: build

build:
	$(CARGO) build --workspace --bins

## run: both binaries out of cluster against the current kube context (Ctrl-C stops both).
run: build
	@if [ -z "$(NODE_NAME)" ]; then echo "NODE_NAME is empty: pass make run NODE_NAME=<node>"; exit 2; fi
	@echo "controller-manager on 127.0.0.1:8080, node-agent (NODE_NAME=$(NODE_NAME)) on 127.0.0.1:8081, dry-run=$(DRY_RUN)"
	@DRY_RUN=$(DRY_RUN) $(TARGET_DIR)/debug/controller-manager --admin-addr 127.0.0.1:8080 --leader-elect=false & cm=$$!; \
	  DRY_RUN=$(DRY_RUN) NODE_NAME=$(NODE_NAME) $(TARGET_DIR)/debug/node-agent --admin-addr 127.0.0.1:8081 & na=$$!; \
	  trap 'kill -TERM $$cm $$na 2>/dev/null' INT TERM; \
	  wait $$cm $$na; wait $$cm $$na 2>/dev/null; true

## test: formatting, lints, every test (root/netns tests when root, cluster tests when KUBECONFIG is set), chart checks.
test: fmt lint unit chart-check

fmt:
	$(CARGO) fmt --all -- --check

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace

chart-check: tools
	@if [ -f charts/groundskeeper/Chart.yaml ]; then bash charts/check.sh "$(HELM)" "$(KUBECTL)"; \
	  else echo "SKIPPED chart-check: no chart yet"; fi

tools:
	@bash .ci/tools.sh >/dev/null

## crds: regenerate the committed CRD YAML (crds/ and the chart) from the Rust types.
crds:
	UPDATE_CRDS=1 $(CARGO) test -p groundskeeper-node-agent --test crds

bench:
	$(CARGO) bench --workspace

clean:
	$(CARGO) clean
