#!/usr/bin/env bash
# Install the Pitstop Slurm agent on a Slurm controller from a checkout of Pitstop. Run as root on
# the controller VM, whose service account is the cluster's own pitstop-slurm-CLUSTER account (see
# `pitstop deploy`): it may pull this cluster's commands and publish their results to the cluster's
# own results topic, nothing else (no Firestore access: claims and results live in a local SQLite
# ledger).
#   sudo bash install-agent.sh PROJECT CLUSTER [PITSTOP_SOURCE_DIR]
# It builds the agent's wheel from the checkout (functions/pitstop/tools/agent_wheel.py, Python
# 3.11+) and hands it to startup-agent.sh, which installs it into /opt/pitstop/venv, writes
# /etc/pitstop/agent.env and starts the unit. Without a checkout on the controller, copy the wheel
# (`make agent-wheel`) to a bucket and run startup-agent.sh instead (docs/deploy.md "Slurm agent").
# PITSTOP_IMPERSONATE_SA, when set, is passed on (startup-agent.sh --impersonate-service-account).
set -euo pipefail
project=${1:?project}; cluster=${2:?cluster name}; src=${3:-$(cd "$(dirname "$0")/../.." && pwd)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
wheel=$("${PYTHON:-python3}" "$src/functions/pitstop/tools/agent_wheel.py" --out "$out")
bash "$src/infra/slurm/startup-agent.sh" --project "$project" --cluster "$cluster" --wheel "$wheel"
"${SYSTEMCTL:-systemctl}" --no-pager status pitstop-slurm-agent | head -5 || true
