#!/usr/bin/env bash
# Install (or upgrade) the Pitstop Slurm agent on a Slurm controller from its wheel: a startup
# script for Cluster Toolkit's controller (a `shell` runner of the startup-script module, with
# `args`), or for a person as root. Safe to run at every boot: it changes only what differs and
# restarts the agent only then.
#
#   startup-agent.sh --project P --cluster C --wheel gs://BUCKET/pitstop_slurm_agent-V-py3-none-any.whl
#                    [--impersonate-service-account pitstop-slurm-C@P.iam.gserviceaccount.com]
#
# Each flag may come from the environment instead: PITSTOP_PROJECT, PITSTOP_CLUSTER, PITSTOP_WHEEL,
# PITSTOP_IMPERSONATE_SA. The wheel is `make agent-wheel`'s (dist/), copied to a bucket the
# controller's account can read, or a local path. It goes into /opt/pitstop/venv with its
# dependencies from the package index pip is configured with (PIP_INDEX_URL for a mirror);
# /etc/pitstop/agent.env says which subscription and topic the agent uses and, with
# --impersonate-service-account, which service account it calls them as (the controller's own
# account then needs roles/iam.serviceAccountTokenCreator on it: docs/deploy.md "Slurm agent").
# uninstall-agent.sh removes all of it. PITSTOP_ROOT (a directory standing in for /), SYSTEMCTL
# and PYTHON are for tests.
set -euo pipefail

project=${PITSTOP_PROJECT:-}
cluster=${PITSTOP_CLUSTER:-}
wheel=${PITSTOP_WHEEL:-}
impersonate=${PITSTOP_IMPERSONATE_SA:-}
usage="usage: startup-agent.sh --project P --cluster C --wheel gs://...|PATH [--impersonate-service-account SA]"
while [ $# -gt 0 ]; do
  case "$1" in
    --project) project=${2:?--project needs a value}; shift 2 ;;
    --cluster) cluster=${2:?--cluster needs a value}; shift 2 ;;
    --wheel) wheel=${2:?--wheel needs a value}; shift 2 ;;
    --impersonate-service-account) impersonate=${2:?--impersonate-service-account needs a value}; shift 2 ;;
    --project=*) project=${1#*=}; shift ;;
    --cluster=*) cluster=${1#*=}; shift ;;
    --wheel=*) wheel=${1#*=}; shift ;;
    --impersonate-service-account=*) impersonate=${1#*=}; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done

fail() { echo "startup-agent.sh: $*" >&2; exit 2; }
[[ $project =~ ^[a-z][a-z0-9-]{4,28}[a-z0-9]$ ]] || fail "--project: '$project' is not a project id"
[[ $cluster =~ ^[a-z][a-z0-9-]{0,39}$ ]] || fail "--cluster: '$cluster' is not a cluster name of deploy.yaml"
[[ $wheel == *.whl ]] || fail "--wheel: '$wheel' is not a wheel (gs://.../NAME.whl or a path)"
if [ -n "$impersonate" ] && ! [[ $impersonate =~ ^[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z0-9.-]+\.iam\.gserviceaccount\.com$ ]]; then
  fail "--impersonate-service-account: '$impersonate' is not a service account email"
fi

root=${PITSTOP_ROOT:-}
systemctl=${SYSTEMCTL:-systemctl}
python=${PYTHON:-python3}
venv=$root/opt/pitstop/venv
unit=pitstop-slurm-agent
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. The wheel, under its own name (pip reads the version and tags from it).
case "$wheel" in
  gs://*) gcloud storage cp --quiet "$wheel" "$work/" ;;
  *) cp "$wheel" "$work/" ;;
esac
got=$work/$(basename "$wheel")

# 2. The virtualenv, and the wheel in it unless this exact wheel is installed already.
stamp=$root/opt/pitstop/installed.sha256
sum=$(sha256sum "$got" | cut -d' ' -f1)
changed=0
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$sum" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade --force-reinstall "$got"
  echo "$sum" > "$stamp"
  changed=1
  echo "installed $(basename "$got") into $venv"
else
  echo "current   $(basename "$got") in $venv"
fi

# 3. The agent's configuration.
mkdir -p "$root/etc/pitstop"
cat > "$work/agent.env" <<ENV
PITSTOP_PROJECT=$project
PITSTOP_SUBSCRIPTION=pitstop-slurm-$cluster-agent
PITSTOP_RESULTS_TOPIC=pitstop-slurm-$cluster-results
PITSTOP_LEDGER=/var/lib/pitstop/agent-ledger.sqlite
PITSTOP_IMPERSONATE_SA=$impersonate
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
ENV
if ! cmp -s "$work/agent.env" "$root/etc/pitstop/agent.env"; then
  install -m 0644 "$work/agent.env" "$root/etc/pitstop/agent.env"
  changed=1
  echo "wrote     $root/etc/pitstop/agent.env"
fi

# 4. The unit (infra/slurm/pitstop-slurm-agent.service: a test checks this copy is the same).
mkdir -p "$root/etc/systemd/system"
cat > "$work/$unit.service" <<'UNIT'
[Unit]
Description=Pitstop Slurm agent: executes Pitstop's drain/resume/requeue/signal commands
After=network-online.target slurmctld.service
Wants=network-online.target

[Service]
Type=simple
EnvironmentFile=/etc/pitstop/agent.env
ExecStart=/opt/pitstop/venv/bin/python -m pitstop.agent.slurm --project ${PITSTOP_PROJECT} --subscription ${PITSTOP_SUBSCRIPTION} --results-topic ${PITSTOP_RESULTS_TOPIC} --ledger ${PITSTOP_LEDGER}
Restart=always
# /var/lib/pitstop: the claim/result ledger (SQLite), kept across restarts and upgrades.
StateDirectory=pitstop
StateDirectoryMode=0700
RestartSec=5
# Outbound connections only; no listening sockets.
NoNewPrivileges=true
ProtectSystem=full
ProtectHome=true
PrivateTmp=true

[Install]
WantedBy=multi-user.target
UNIT
if ! cmp -s "$work/$unit.service" "$root/etc/systemd/system/$unit.service"; then
  install -m 0644 "$work/$unit.service" "$root/etc/systemd/system/$unit.service"
  "$systemctl" daemon-reload
  changed=1
  echo "wrote     $root/etc/systemd/system/$unit.service"
fi

# 5. Running, with what was just written.
"$systemctl" enable "$unit"
if [ "$changed" = 1 ]; then
  "$systemctl" restart "$unit"
  echo "restarted $unit"
else
  "$systemctl" start "$unit"
  echo "running   $unit (nothing changed)"
fi
