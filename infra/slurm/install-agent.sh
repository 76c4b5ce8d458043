#!/usr/bin/env bash
# Install the Pitstop Slurm agent on a Slurm controller. Run as root on the controller VM,
# whose service account is the cluster's own pitstop-slurm-CLUSTER account (see `pitstop deploy`):
# it may pull this cluster's commands and publish their results to the cluster's own results
# topic, nothing else (no Firestore access: claims and results live in a local SQLite ledger).
#   sudo bash install-agent.sh PROJECT CLUSTER [PITSTOP_SOURCE_DIR]
set -euo pipefail
project=${1:?project}; cluster=${2:?cluster name}; src=${3:-$(cd "$(dirname "$0")/../.." && pwd)}
python3 -m venv /opt/pitstop/venv
/opt/pitstop/venv/bin/pip install --quiet "$src"
mkdir -p /etc/pitstop
cat > /etc/pitstop/agent.env <<ENV
PITSTOP_PROJECT=$project
PITSTOP_SUBSCRIPTION=pitstop-slurm-$cluster-agent
PITSTOP_RESULTS_TOPIC=pitstop-slurm-$cluster-results
PITSTOP_LEDGER=/var/lib/pitstop/agent-ledger.sqlite
SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
ENV
install -m 0644 "$src/infra/slurm/pitstop-slurm-agent.service" /etc/systemd/system/
systemctl daemon-reload
systemctl enable --now pitstop-slurm-agent
systemctl --no-pager status pitstop-slurm-agent | head -5
