#!/usr/bin/env bash
# System packages the local stack needs (Slurm, munge, the gcloud emulators, Java), and Chromium
# (headless) for the test that opens `pitstop report`'s page in a browser.
# Idempotent; needs root (CI and the dev machines run as root). Safe to run every time.
set -euo pipefail
need=()
for pkg in slurmctld slurmd slurm-client munge chromium; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
for pkg in google-cloud-cli-firestore-emulator google-cloud-cli-pubsub-emulator; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  echo "installing: ${need[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
