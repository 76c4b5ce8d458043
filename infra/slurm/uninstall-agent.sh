#!/usr/bin/env bash
# Remove the Pitstop Slurm agent from a Slurm controller: everything install-agent.sh put there.
# Run as root on the controller VM:
#   sudo bash uninstall-agent.sh [--purge]
# Removes the systemd unit (stopped and disabled first), /opt/pitstop (the agent's virtualenv) and
# /etc/pitstop (agent.env). /var/lib/pitstop (the command ledger and the checks' outputs) stays
# unless --purge: a reinstall that keeps it never runs a command twice that Pub/Sub redelivers.
# Slurm itself is not changed: nodes Pitstop drained and reservations of an interrupted check are
# listed at the end for a person to resume or delete (docs/operations.md, "Uninstall").
# PITSTOP_ROOT (a directory standing in for /) and SYSTEMCTL are for tests.
set -euo pipefail
purge=0
case "${1:-}" in
  --purge) purge=1 ;;
  "") ;;
  *) echo "usage: uninstall-agent.sh [--purge]" >&2; exit 2 ;;
esac
root=${PITSTOP_ROOT:-}
systemctl=${SYSTEMCTL:-systemctl}
unit=pitstop-slurm-agent
unit_file="$root/etc/systemd/system/$unit.service"

if [ -e "$unit_file" ]; then
  "$systemctl" disable --now "$unit" || echo "warning: could not stop $unit; removing it anyway" >&2
  rm -f "$unit_file"
  "$systemctl" daemon-reload
  echo "removed   $unit_file (stopped and disabled)"
else
  echo "absent    $unit_file"
fi
for dir in "$root/opt/pitstop" "$root/etc/pitstop"; do
  if [ -e "$dir" ]; then rm -rf "$dir" && echo "removed   $dir"; else echo "absent    $dir"; fi
done
if [ "$purge" = 1 ]; then
  rm -rf "$root/var/lib/pitstop" && echo "removed   $root/var/lib/pitstop (--purge)"
else
  echo "kept      $root/var/lib/pitstop (the command ledger; --purge removes it)"
fi

# What Pitstop left in Slurm, for a person to look at (read-only).
if command -v sinfo >/dev/null 2>&1; then
  drained=$(sinfo -h -R -o '%N|%E' 2>/dev/null | grep '|pitstop ' || true)
  if [ -n "$drained" ]; then
    echo "nodes still drained by Pitstop (resume each once checked: scontrol update NodeName=N State=RESUME):"
    echo "$drained" | sed 's/^/  /'
  fi
  held=$(scontrol show reservation 2>/dev/null | grep -o 'ReservationName=pitstop-[^ ]*' || true)
  if [ -n "$held" ]; then
    echo "reservations of interrupted checks (scontrol delete ReservationName=R):"
    echo "$held" | sed 's/^ReservationName=/  /'
  fi
fi
