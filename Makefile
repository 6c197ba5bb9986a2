# SPDX-License-Identifier: GPL-3.0-or-later
# One entry point for set-up, checks and the demo.  `make test` is what CI runs.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := test

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
BUILD := build
DIST := dist
COLLECTION_LINK := $(BUILD)/collections/ansible_collections/gpuharden/k8s
NVML_DOUBLE := $(BUILD)/nvml/libnvidia-ml.so.1
# Debian packages the checks need (installed only when missing; needs root).
DEBIAN_PACKAGES := gcc make git openssh-server openssh-client runc iproute2 openssl curl util-linux chromium prometheus prometheus-pushgateway debootstrap zstd
PY_SOURCES := src lab/src tests plugins tools bench

export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup system-deps venv collection-link nvml-double control-plane test lint ruff ansible-lint sanity unit fuzz \
        integration sandbox molecule test-checks test-lab dist-install-check monitoring-check image-check dist dist-venv dist-url-check python-dist collection-build collection-install-check demo bench lab-down clean

setup: system-deps venv collection-link nvml-double control-plane

system-deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages:$$missing (run as root or install them)" >&2; exit 2; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  case " $$missing " in *" prometheus "*) \
	    : "only promtool is wanted: on a systemd host the package starts a Prometheus server on :9090, stop it"; \
	    if [ -d /run/systemd/system ]; then systemctl disable --now prometheus >/dev/null 2>&1 || true; fi;; \
	  esac; \
	  case " $$missing " in *" prometheus-pushgateway "*) \
	    : "the tests start their own on a free port: stop the package's service on :9091"; \
	    if [ -d /run/systemd/system ]; then systemctl disable --now prometheus-pushgateway >/dev/null 2>&1 || true; fi;; \
	  esac; \
	fi

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Re-install when pyproject.toml changes; the stamp keeps warm runs fast.
$(VENV)/.installed: pyproject.toml lab/pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]' -e lab
	touch $@

venv: $(VENV)/.installed

collection-link:
	@mkdir -p $(dir $(COLLECTION_LINK))
	@ln -sfn $(CURDIR) $(COLLECTION_LINK)

nvml-double: $(NVML_DOUBLE)
$(NVML_DOUBLE): $(wildcard tests/fakes/nvml/*.c tests/fakes/nvml/*.h tests/fakes/nvml/build.sh)
	sh tests/fakes/nvml/build.sh $(CURDIR)/$(BUILD)/nvml >/dev/null

# kube-apiserver, kube-controller-manager, kube-scheduler, etcd, kwok and kubelet-validate, built from the
# Go module proxy into ~/.cache/gpuharden (cold: minutes; warm: a second).
control-plane:
	bash lab/controlplane/build.sh >/dev/null

# dist and real-components first: the lab test of the installed artifacts (tests/integration/test_installed_artifacts.py)
# uses dist/, and the real-node scenarios (healthy, fresh-fleet, bare, real-nodes) need the real kubelet, containerd,
# toolkit and plugin (cold: minutes, docs/benchmarks.md "Build and test times"; warm: about a second).  Then two streams side by
# side.  The lab stream, the longer: `integration`, every lab test, stand-in and real-node scenarios alike, on
# LAB_WORKERS labs at once.  The side stream: every check that needs no lab, niced so that the labs keep their cores,
# then molecule, not niced, on a lab instance of its own (SIDE_LAB_INSTANCE).  The side stream writes
# build/test-checks.log, printed when both are done, so the lab's output stays live.  Under `make test` a test whose
# upstream binary is missing fails instead of skipping (GPUHARDEN_REQUIRE_BUILT, tests/builds.py).  The last line
# gives each part's exit code and seconds since the start; a missing status counts as a failure.  Above it, when a part
# failed, tools/failure_digest.py names each failed task and test with its message (CI keeps only the tail).
test: setup dist real-components
	@export GPUHARDEN_REQUIRE_BUILT=1; start=$$(date +%s); status=$(BUILD)/test-side.status; rm -f "$$status"; \
	( checks_rc=0; nice -n 10 $(MAKE) --no-print-directory test-checks || checks_rc=$$?; checks_s=$$(( $$(date +%s) - start )); \
	  molecule_rc=0; GPUHARDEN_LAB_INSTANCE=$(SIDE_LAB_INSTANCE) $(MAKE) --no-print-directory molecule || molecule_rc=$$?; \
	  echo "$$checks_rc $$checks_s $$molecule_rc $$(( $$(date +%s) - start ))" > "$$status" \
	) > $(BUILD)/test-checks.log 2>&1 & \
	lab_rc=0; $(MAKE) --no-print-directory integration 2>&1 | tee $(BUILD)/integration.log || lab_rc=$$?; \
	lab_s=$$(( $$(date +%s) - start )); \
	wait; \
	echo "=== make test: the side stream (build/test-checks.log)"; cat $(BUILD)/test-checks.log; \
	checks_rc=missing; checks_s=-; molecule_rc=missing; molecule_s=-; \
	if [ -s "$$status" ]; then read -r checks_rc checks_s molecule_rc molecule_s < "$$status"; fi; \
	if [ "$$lab_rc" != 0 ] || [ "$$checks_rc" != 0 ] || [ "$$molecule_rc" != 0 ]; then \
	  $(BIN)/python tools/failure_digest.py $(BUILD)/integration.log $(BUILD)/test-checks.log || true; fi; \
	echo "=== make test (seconds since the start): integration rc=$$lab_rc at $$lab_s s;" \
	  "test-checks rc=$$checks_rc at $$checks_s s, molecule rc=$$molecule_rc at $$molecule_s s;" \
	  "all in $$(( $$(date +%s) - start )) s"; \
	[ "$$lab_rc" = 0 ] && [ "$$checks_rc" = 0 ] && [ "$$molecule_rc" = 0 ]

test-checks: lint sanity monitoring-check unit sandbox real-components real dist-install-check

test-lab: integration molecule

lint: ruff ansible-lint

ruff: venv
	$(BIN)/ruff check $(PY_SOURCES)

ansible-lint: venv collection-link
	$(BIN)/ansible-lint --offline --profile production

sanity: venv
	$(BIN)/python tools/sanity.py

# deploy/monitoring: the alerting rules and their unit tests, and promtool's lint of the textfile `gpuharden drift
# --prometheus` writes (tools/monitoring_sample.py: the real prometheus_text() of a sample fleet).  promtool comes
# with the Debian package prometheus (system-deps); tests/unit/test_monitoring.py runs the same checks and more.
monitoring-check: venv
	promtool check rules deploy/monitoring/gpuharden-alerts.yml
	cd deploy/monitoring/tests && promtool test rules alerts-test.yml
	@mkdir -p $(BUILD)
	$(BIN)/python tools/monitoring_sample.py > $(BUILD)/gpuharden-sample.prom
	promtool check metrics < $(BUILD)/gpuharden-sample.prom

unit: venv collection-link nvml-double
	$(BIN)/python -m pytest -q -m "not lab and not real and not sandbox"

# tests/fuzz, the hostile-input harness (issue 47), for long: FUZZ_EXAMPLES generated cases per module (14 modules,
# about 1,400 distinct cases at the default, 20-30 min here), a random seed printed with the summary
# (GPUHARDEN_FUZZ_SEED=<seed> repeats a run).  The table of cases per module and outcome goes to build/fuzz-summary.txt,
# every outcome outside the two allowed to build/fuzz-findings.txt.  `make unit` runs the same generator bounded (a
# fixed, derandomized handful per module) and the named regression cases.  Successes are judged by kubelet-validate
# (control-plane) and the real containerd's loader (real-components).
FUZZ_EXAMPLES ?= 100
fuzz: venv collection-link nvml-double control-plane real-components
	GPUHARDEN_FUZZ=long GPUHARDEN_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -p no:cacheprovider tests/fuzz/test_hostile.py

# Root, runc and cgroups in throwaway sandboxes of their own (tests/lab/test_pods.py, test_standins.py, the device
# cgroup audit against real runc programs): no lab, so `make test` runs them beside the lab tests.
sandbox: setup
	$(BIN)/python -m pytest -q -m "sandbox and not lab"

# tests/real: the upstream binaries (device plugin, containerd, kubelet, a grpc-go pod-resources server) judge what
# the product writes and reads.  `make test` builds the quick ones (real-quick, about 7 min cold); the tests of
# containerd and the kubelet skip, naming `make real-components`, where those are not built (about 17 min cold).
real: setup real-quick
	$(BIN)/python -m pytest -q -m real

# The lab: network namespaces, sshd, runc and the control plane (root).  LAB_WORKERS labs at once (pytest-xdist,
# one lab instance per worker, a whole test file per worker: tests/conftest.py); LAB_WORKERS=0 runs them in this
# process on lab instance 0, one at a time.
LAB_WORKERS ?= 2
# The lab instance of make test's side stream (molecule): the first one integration does not use.
SIDE_LAB_INSTANCE ?= $(if $(filter-out 0,$(LAB_WORKERS)),$(LAB_WORKERS),1)
# Every lab test; those marked real_nodes need real-components (built first, warm: about a second).  Each test's worker,
# start, end and children's CPU go to build/integration-timeline.tsv (tests/timeline.py), for balancing the workers.
integration: setup real-components
	rm -f $(BUILD)/integration-timeline.tsv
	GPUHARDEN_TEST_TIMELINE=$(CURDIR)/$(BUILD)/integration-timeline.tsv \
	$(BIN)/python -m pytest -q -m lab --durations=15 --junitxml=$(BUILD)/integration-junit.xml \
	  $(if $(filter-out 0,$(LAB_WORKERS)),-n $(LAB_WORKERS) --dist loadfile,-p no:xdist)

# On lab instance GPUHARDEN_LAB_INSTANCE (default 0), under the lock the lab tests take for that instance
# (tests/labfixtures.py); molecule.yml takes the inventory that instance's `gpuharden lab up` writes.
molecule: setup
	@eval "$$($(BIN)/python -c 'from gpuharden_lab import layout; \
	  print("lock=%s inventory=%s" % (layout.LOCK_FILE, layout.INVENTORY_FILE.name))')"; \
	echo "molecule on lab instance $${GPUHARDEN_LAB_INSTANCE:-0} ($$inventory)"; \
	GPUHARDEN_LAB_INVENTORY_NAME=$$inventory flock $$lock $(BIN)/molecule test

# What an adopter installs, in dist/: the CLI's wheel and sdist (`pip install`; never the lab, which is its own
# distribution in lab/) and the collection tarball (`ansible-galaxy collection install`; galaxy.yml's build_ignore
# leaves out tests, lab, tool configs and the developer docs).  Built with the build tools only, in a venv of their
# own (DIST_VENV: build, setuptools, wheel and ansible-core, pinned as pyproject.toml pins them: tools/dist.py
# requirements), never the development venv: no test tools, and the Python build runs without isolation, offline.
# GPUHARDEN_URL, the project's public URL, replaces the placeholder https://gpuharden.invalid in galaxy.yml, the
# systemd units and the alert rules' runbook_url (unset: the web URL of the clone's origin remote, where that is an
# https or ssh one): without one (or with a .invalid one) make dist refuses and builds nothing (tools/dist.py).
# GPUHARDEN_SOURCE_URL (default GPUHARDEN_URL/blob/main; for a release, its tag) is where the shipped README's
# relative links point.  `make test` builds a test tarball (DIST_TEST=1: a .invalid URL, never for release).
GPUHARDEN_URL ?=
GPUHARDEN_SOURCE_URL ?=
DIST_TEST ?=
DIST_VENV := $(BUILD)/dist-venv
test: DIST_TEST = 1
test: GPUHARDEN_URL := $(or $(GPUHARDEN_URL),https://test-build.gpuharden.invalid)

dist: python-dist collection-build

$(DIST_VENV)/.installed: pyproject.toml tools/dist.py
	rm -rf $(DIST_VENV)
	$(PYTHON) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/pip install -q --upgrade pip
	$(DIST_VENV)/bin/pip install -q $$($(PYTHON) tools/dist.py requirements | tr '\n' ' ')
	touch $@

dist-venv: $(DIST_VENV)/.installed

# Before anything is built: no archive at all rather than one of three.
dist-url-check: dist-venv
	@GPUHARDEN_URL='$(GPUHARDEN_URL)' $(DIST_VENV)/bin/python tools/dist.py check-url $(if $(DIST_TEST),--test-build)

python-dist: dist-venv dist-url-check
	@mkdir -p $(DIST)
	rm -f $(DIST)/gpuharden-*.whl $(DIST)/gpuharden-[0-9]*.tar.gz
	$(DIST_VENV)/bin/python -m build --no-isolation --quiet --outdir $(DIST) .

collection-build: dist-venv dist-url-check
	@mkdir -p $(DIST)
	rm -f $(DIST)/gpuharden-k8s-*.tar.gz
	GPUHARDEN_URL='$(GPUHARDEN_URL)' GPUHARDEN_SOURCE_URL='$(GPUHARDEN_SOURCE_URL)' \
	  $(DIST_VENV)/bin/python tools/dist.py collection --output-path $(DIST) $(if $(DIST_TEST),--test-build)

# Install the built tarball into a scratch path and run its module there, away from this checkout.
collection-install-check: collection-build
	$(MAKE) --no-print-directory dist-install-check

# The same check of the tarball already in dist/, never rebuilt: `make test` builds dist/ first, and its lab stream
# installs those archives too (test_installed_artifacts.py), so the checks stream must not remove them meanwhile.
dist-install-check: nvml-double
	$(BIN)/python tools/install_check.py $(DIST)/gpuharden-k8s-*.tar.gz

# The drift CronJob's image (deploy/kubernetes/Containerfile) from dist/ without a container engine: its root file
# system built in a chroot from a debootstrap of the base's Debian release, then gpuharden, ansible-galaxy and the
# CronJob's own command run in it as the pod runs them (tools/image_rootfs_check.py).  Root, the Debian mirror and
# the package index; not part of `make test` (warm 62-79 s on the shared 2-core machine, most of it pip).
image-check: dist
	$(BIN)/python tools/image_rootfs_check.py --context $(DIST)

demo: setup
	$(BIN)/python -m gpuharden_lab.demo

# Benchmarks (not part of `make test`): every goal side by side, as ratios; root, minutes.
bench: setup
	$(BIN)/python bench/run.py

lab-down: venv
	$(BIN)/gpuharden lab down

clean:
	rm -rf $(BUILD) $(DIST) $(VENV) ansible_collections

# The real NVIDIA device plugin (both releases pinned in lab/realcomponents/versions.env) and its kubelet-side
# client dp-listwatch, built from the Go module proxy into ~/.cache/gpuharden/realcomponents (cold, loaded 2-core
# machine: v0.18.2 about 4.5 min with empty Go caches, 2 min with the control plane's; v0.15.0 about 3 min; warm:
# instant).  The pod-resources server (grpc-go, k8s.io/kubelet's generated service): seconds.
.PHONY: real real-quick real-device-plugin real-podresources-server real-components
real-device-plugin:
	bash lab/realcomponents/build-device-plugin.sh >/dev/null

real-podresources-server:
	bash lab/realcomponents/build-podresources-server.sh >/dev/null

real-quick: real-device-plugin real-podresources-server

real-components: real-quick real-containerd real-kubelet real-kubeadm real-pod-support real-container-toolkit

# The lab's real-node scenarios (real-nodes, healthy, fresh-fleet, bare): the real kubelet, containerd and device
# plugin as lab nodes (docs/development.md).  real-nodes runs only their tests (marker real_nodes; `make integration`
# and so `make test` run them with the others) on what real-components built (without the build they skip and name
# real-lab); real-lab builds first.  One test at a time, on lab instance GPUHARDEN_LAB_INSTANCE (default 0).
.PHONY: real-lab real-nodes
real-lab: setup real-components real-nodes

real-nodes: setup
	$(BIN)/python -m pytest -q -m "lab and real_nodes" -p no:xdist --durations=5

# The real containerd (2.x and 1.7, each with ctr and its runc shim; cri-status, a CRI Status client, with 2.x) and
# the real kubelet at the control plane's K8S_VERSION (lab/controlplane/build.sh), built from the Go module proxy
# into ~/.cache/gpuharden/realcomponents with the control plane's Go caches (cold, loaded 2-core machine: containerd
# 2.4.2 about 8 min, 1.7.35 about 5 min, kubelet about 3.5 min after the control plane; each runc shim 12-40 s more
# with containerd's build cache; warm: instant).
.PHONY: real-containerd real-kubelet real-kubeadm real-pod-support real-container-toolkit
real-containerd:
	bash lab/realcomponents/build-containerd.sh >/dev/null

real-kubelet:
	bash lab/realcomponents/build-kubelet.sh >/dev/null

# kubeadm from the kubelet's wrapper module (after it: the same build cache), for what `kubeadm upgrade node` does to a
# node's kubelet files (tests/integration/test_kubeadm_upgrade.py).
real-kubeadm: real-kubelet
	bash lab/realcomponents/build-kubelet.sh kubeadm >/dev/null

# Real pods on the real nodes: the CNI plugins (bridge, host-local, loopback; cold about 2 min with the control
# plane's Go caches) and the static sandbox binary the lab builds its sandbox image from (gcc, a second).
real-pod-support:
	bash lab/realcomponents/build-pod-support.sh >/dev/null

# The NVIDIA container toolkit's runtime side (nvidia-container-runtime, nvidia-cdi-hook, nvidia-ctk), which prepares
# the device plugin's container on the real nodes (cold, empty caches: see docs/benchmarks.md, "Build and test times"; warm: instant).
real-container-toolkit:
	bash lab/realcomponents/build-container-toolkit.sh >/dev/null
